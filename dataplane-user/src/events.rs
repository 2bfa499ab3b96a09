//! The event log: every detector verdict as an operator-facing event, served by `/v1/events`,
//! summarized in `/metrics`, and persisted so that an open event survives an agent restart.
//!
//! Invariants:
//! - memory is bounded: all open events (bounded by the detectors' own scope limits) plus the
//!   `recent` most recently closed ones;
//! - event ids are unique across restarts (the next id is persisted with the open events);
//! - times are wall-clock milliseconds (the detectors' CLOCK_MONOTONIC times converted at the
//!   window they were reported in), so they mean the same thing after a restart;
//! - an event loaded from the state file is open and `carried_over` until the detectors raise the
//!   same (job, kind, scope) again (it is then *confirmed* and keeps its id and start), or
//!   `carry_over_windows` detection windows pass without that, when it closes as
//!   `not_confirmed`;
//! - the state file is written atomically (temporary file + rename) whenever the set of open
//!   events or their severity/classification changes. A missing file is a fresh start; an
//!   unreadable or corrupt one is logged, counted, moved aside and also a fresh start: the agent
//!   never refuses to start over its own state.
use std::{
    collections::{BTreeMap, VecDeque},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    clock::Clock,
    detect::{EndReason, Verdict, VerdictChange, VerdictKind},
};

/// File name of the persisted open events inside `state_dir`.
pub const STATE_FILE: &str = "events.json";
/// Version of the state file format.
pub const STATE_VERSION: u32 = 1;

// The event as `GET /v1/events` serves it (and the state file stores it) is the operator API's.
pub use ringside_client::operator::{Event, EventEnd, EventState};

impl From<EndReason> for EventEnd {
    fn from(r: EndReason) -> Self {
        match r {
            EndReason::Cleared => EventEnd::Cleared,
            EndReason::Expired => EventEnd::Expired,
        }
    }
}

#[derive(Debug, Clone)]
struct OpenEvent {
    event: Event,
    /// The detectors' verdict id; `None` for a carried-over event not yet confirmed.
    verdict: Option<u64>,
    /// Windows left before an unconfirmed carried-over event closes.
    carry_windows_left: u32,
}

/// The persisted state: the open events and the next id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedEvents {
    pub version: u32,
    pub saved_unix_ms: u64,
    pub next_id: u64,
    pub open: Vec<Event>,
}

/// Why the state file could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("cannot read {path}: {source}; starting with no carried-over events")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is corrupt ({message}); moved aside to {moved_to}, starting with no carried-over events")]
    Corrupt { path: PathBuf, message: String, moved_to: String },
    #[error("cannot write {path}: {source}; open events will not survive a restart until `state_dir` is writable")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Counters of the event log, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// Detection windows run (one per tick, however many jobs).
    pub windows: u64,
    /// Windows the detectors rejected (a collector bug or a capacity limit).
    pub input_errors: u64,
    /// State files that could not be read or were corrupt at start.
    pub state_load_errors: u64,
    /// Failed state-file writes.
    pub state_write_errors: u64,
}

/// Open events and a bounded history of closed ones.
#[derive(Debug, Clone)]
pub struct EventLog {
    open: BTreeMap<u64, OpenEvent>,
    recent: VecDeque<Event>,
    max_recent: usize,
    carry_over_windows: u32,
    next_id: u64,
    /// Events opened by the detectors, by kind (carried-over ones are not counted again).
    opened_total: BTreeMap<VerdictKind, u64>,
    pub counters: EventCounters,
}

impl EventLog {
    pub fn new(max_recent: usize, carry_over_windows: u32) -> Self {
        EventLog {
            open: BTreeMap::new(),
            recent: VecDeque::new(),
            max_recent: max_recent.max(1),
            carry_over_windows,
            next_id: 1,
            opened_total: BTreeMap::new(),
            counters: EventCounters::default(),
        }
    }

    /// Adds the open events of a previous run as carried over.
    pub fn carry_over(&mut self, state: PersistedEvents) {
        self.next_id = self.next_id.max(state.next_id);
        for mut e in state.open {
            if e.state != EventState::Open || self.open.contains_key(&e.id) {
                continue;
            }
            e.carried_over = true;
            e.confirmed = false;
            self.next_id = self.next_id.max(e.id + 1);
            self.open.insert(e.id, OpenEvent { event: e, verdict: None, carry_windows_left: self.carry_over_windows });
        }
    }

    /// Folds the detectors' changes of one window in. Returns whether the persisted state changed.
    pub fn apply(&mut self, changes: &[VerdictChange], clock: &Clock) -> bool {
        let mut dirty = false;
        for c in changes {
            match c {
                VerdictChange::Opened(v) => {
                    dirty = true;
                    let same = |o: &OpenEvent| {
                        o.verdict.is_none() && o.event.job == v.job && o.event.kind == v.kind && o.event.scope == v.scope
                    };
                    if let Some(o) = self.open.values_mut().find(|o| same(o)) {
                        o.verdict = Some(v.id);
                        o.event.confirmed = true;
                        update(&mut o.event, v);
                        continue;
                    }
                    *self.opened_total.entry(v.kind).or_default() += 1;
                    let id = self.next_id;
                    self.next_id += 1;
                    let mut event = Event {
                        id,
                        job: v.job.clone(),
                        kind: v.kind,
                        scope: v.scope.clone(),
                        severity: v.severity,
                        classification: v.classification,
                        state: EventState::Open,
                        carried_over: false,
                        confirmed: false,
                        started_unix_ms: clock.unix_ms(v.started_ns),
                        raised_unix_ms: clock.unix_ms(v.raised_ns),
                        ended_unix_ms: None,
                        end_reason: None,
                        observed_windows: v.observed_windows,
                        anomalous_windows: v.anomalous_windows,
                        evidence: v.evidence.clone(),
                        signals: Vec::new(),
                    };
                    add_signals(&mut event, v);
                    self.open.insert(id, OpenEvent { event, verdict: Some(v.id), carry_windows_left: 0 });
                }
                VerdictChange::Updated(v) => {
                    if let Some(o) = self.open.values_mut().find(|o| o.verdict == Some(v.id)) {
                        dirty |= o.event.severity != v.severity || o.event.classification != v.classification;
                        update(&mut o.event, v);
                    }
                }
                VerdictChange::Closed(v) => {
                    let Some(id) = self.open.iter().find(|(_, o)| o.verdict == Some(v.id)).map(|(id, _)| *id) else { continue };
                    let mut o = self.open.remove(&id).expect("found above");
                    update(&mut o.event, v);
                    o.event.ended_unix_ms = Some(clock.unix_ms(v.ended_ns.unwrap_or(v.raised_ns)));
                    o.event.end_reason = Some(v.end_reason.map_or(EventEnd::Cleared, EventEnd::from));
                    self.close(o.event);
                    dirty = true;
                }
            }
        }
        dirty
    }

    /// Refreshes the evidence and window counts of open events from the detectors' open verdicts.
    pub fn refresh<'a>(&mut self, open: impl Iterator<Item = &'a Verdict>) {
        for v in open {
            if let Some(o) = self.open.values_mut().find(|o| o.verdict == Some(v.id)) {
                update(&mut o.event, v);
            }
        }
    }

    /// Ends one detection window: unconfirmed carried-over events count down and close as
    /// `not_confirmed` at zero. Returns whether the persisted state changed.
    pub fn end_window(&mut self, clock: &Clock) -> bool {
        let expired: Vec<u64> = self
            .open
            .iter_mut()
            .filter(|(_, o)| o.verdict.is_none())
            .filter_map(|(id, o)| {
                o.carry_windows_left = o.carry_windows_left.saturating_sub(1);
                (o.carry_windows_left == 0).then_some(*id)
            })
            .collect();
        for id in &expired {
            let mut e = self.open.remove(id).expect("listed above").event;
            e.state = EventState::Closed;
            e.ended_unix_ms = Some(clock.unix_ms);
            e.end_reason = Some(EventEnd::NotConfirmed);
            self.close(e);
        }
        !expired.is_empty()
    }

    fn close(&mut self, mut e: Event) {
        e.state = EventState::Closed;
        if self.recent.len() == self.max_recent {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
    }

    /// Open events, oldest id first.
    pub fn open_events(&self) -> impl Iterator<Item = &Event> {
        self.open.values().map(|o| &o.event)
    }

    /// Closed events still retained, newest first.
    pub fn recent_closed(&self) -> impl Iterator<Item = &Event> {
        self.recent.iter().rev()
    }

    /// Events opened by the detectors since start, by kind.
    pub fn opened_total(&self, kind: VerdictKind) -> u64 {
        self.opened_total.get(&kind).copied().unwrap_or(0)
    }

    /// What the state file holds.
    pub fn persisted(&self, saved_unix_ms: u64) -> PersistedEvents {
        PersistedEvents { version: STATE_VERSION, saved_unix_ms, next_id: self.next_id, open: self.open_events().cloned().collect() }
    }
}

fn update(e: &mut Event, v: &Verdict) {
    e.severity = e.severity.max(v.severity);
    e.classification = v.classification.or(e.classification);
    e.observed_windows = v.observed_windows;
    e.anomalous_windows = v.anomalous_windows;
    if !v.evidence.is_empty() {
        e.evidence.clone_from(&v.evidence);
    }
    add_signals(e, v);
}

/// Adds the metrics of `v`'s evidence that `e.signals` lacks (refreshed every window, so every
/// anomalous window's metrics are kept).
fn add_signals(e: &mut Event, v: &Verdict) {
    for m in v.evidence.iter().map(|x| x.metric) {
        if !e.signals.contains(&m) {
            e.signals.push(m);
        }
    }
}

/// Path of the state file in `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

/// Writes the state file atomically: a temporary file in the same directory, fsynced, renamed
/// over the old one. Creates `dir` if needed.
pub fn save(dir: &Path, state: &PersistedEvents) -> Result<(), StateFileError> {
    use std::io::Write as _;
    let path = state_path(dir);
    let werr = |source| StateFileError::Write { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(werr)?;
    let tmp = dir.join(format!(".{STATE_FILE}.tmp"));
    let text = serde_json::to_vec_pretty(state).expect("events serialize");
    let mut f = std::fs::File::create(&tmp).map_err(werr)?;
    f.write_all(&text).and_then(|()| f.sync_all()).map_err(werr)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(werr)
}

/// Loads the state file: `Ok(None)` if there is none. A corrupt file is renamed to
/// `events.json.corrupt` so the next save does not hide the evidence, and reported as an error.
pub fn load(dir: &Path) -> Result<Option<PersistedEvents>, StateFileError> {
    let path = state_path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateFileError::Read { path, source }),
    };
    let parsed = serde_json::from_slice::<PersistedEvents>(&bytes).map_err(|e| e.to_string()).and_then(|s| {
        if s.version == STATE_VERSION {
            Ok(s)
        } else {
            Err(format!("version {} where {STATE_VERSION} was expected", s.version))
        }
    });
    match parsed {
        Ok(s) => Ok(Some(s)),
        Err(message) => {
            let aside = dir.join(format!("{STATE_FILE}.corrupt"));
            let moved_to = match std::fs::rename(&path, &aside) {
                Ok(()) => aside.display().to_string(),
                Err(e) => format!("nowhere ({e})"),
            };
            Err(StateFileError::Corrupt { path, message, moved_to })
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::detect::{Classification, Evidence, Metric, Reference, Scope, Severity, WindowCount};

    pub(crate) fn verdict(id: u64, kind: VerdictKind, peer: &str) -> Verdict {
        Verdict {
            id,
            job: "train".into(),
            kind,
            scope: Scope::Peer { peer: peer.parse().unwrap(), link: "p1".into() },
            severity: Severity::Critical,
            classification: (kind == VerdictKind::GrayFailure).then_some(Classification::Transient),
            started_ns: 10_000_000_000,
            raised_ns: 11_000_000_000,
            ended_ns: None,
            end_reason: None,
            observed_windows: 1,
            anomalous_windows: 1,
            evidence: vec![Evidence {
                metric: Metric::LossRate,
                value: 0.05,
                reference: 0.0,
                reference_kind: Reference::PeerMedian,
                mad: 0.0,
                peers: None,
                windows: WindowCount { anomalous: 1, of: 1 },
            }],
        }
    }

    const CLOCK: Clock = Clock { mono_ns: 20_000_000_000, unix_ms: 1_700_000_020_000 };

    #[test]
    fn verdicts_become_events_and_history_is_bounded() {
        let mut log = EventLog::new(2, 5);
        assert!(log.apply(&[VerdictChange::Opened(verdict(1, VerdictKind::GrayFailure, "10.77.0.2"))], &CLOCK));
        let e = log.open_events().next().unwrap().clone();
        assert_eq!((e.id, e.state, e.started_unix_ms, e.raised_unix_ms), (1, EventState::Open, 1_700_000_010_000, 1_700_000_011_000));
        assert_eq!(log.opened_total(VerdictKind::GrayFailure), 1);
        // An update that changes nothing persisted is not dirty; a classification change is.
        let mut v = verdict(1, VerdictKind::GrayFailure, "10.77.0.2");
        v.observed_windows = 4;
        assert!(!log.apply(&[VerdictChange::Updated(v.clone())], &CLOCK));
        v.classification = Some(Classification::Persistent);
        assert!(log.apply(&[VerdictChange::Updated(v.clone())], &CLOCK));
        v.ended_ns = Some(15_000_000_000);
        v.end_reason = Some(EndReason::Cleared);
        assert!(log.apply(&[VerdictChange::Closed(v)], &CLOCK));
        assert_eq!(log.open_events().count(), 0);
        let c = log.recent_closed().next().unwrap();
        assert_eq!((c.state, c.end_reason, c.ended_unix_ms), (EventState::Closed, Some(EventEnd::Cleared), Some(1_700_000_015_000)));
        assert_eq!(c.classification, Some(Classification::Persistent));
        for id in 2..6 {
            let mut v = verdict(id, VerdictKind::Straggler, "10.77.0.3");
            log.apply(&[VerdictChange::Opened(v.clone())], &CLOCK);
            v.end_reason = Some(EndReason::Expired);
            log.apply(&[VerdictChange::Closed(v)], &CLOCK);
        }
        let ids: Vec<u64> = log.recent_closed().map(|e| e.id).collect();
        assert_eq!(ids, vec![5, 4], "newest first, at most 2");
    }

    #[test]
    fn persistence_round_trip_and_carry_over() {
        let dir = tempdir("roundtrip");
        let mut log = EventLog::new(16, 3);
        log.apply(&[VerdictChange::Opened(verdict(1, VerdictKind::GrayFailure, "10.77.0.2"))], &CLOCK);
        log.apply(&[VerdictChange::Opened(verdict(2, VerdictKind::Straggler, "10.77.0.4"))], &CLOCK);
        save(&dir, &log.persisted(CLOCK.unix_ms)).unwrap();
        assert!(!dir.join(format!(".{STATE_FILE}.tmp")).exists(), "temporary file renamed");

        // Restart: both come back open and carried over; ids continue.
        let loaded = load(&dir).unwrap().unwrap();
        assert_eq!(loaded.open.len(), 2);
        let mut log2 = EventLog::new(16, 3);
        log2.carry_over(loaded);
        assert!(log2.open_events().all(|e| e.carried_over && !e.confirmed && e.state == EventState::Open));
        // The detectors (fresh ids) raise the gray failure again: confirmed, same event id.
        let clock2 = Clock { mono_ns: 5_000_000_000, unix_ms: 1_700_000_100_000 };
        log2.apply(&[VerdictChange::Opened(verdict(1, VerdictKind::GrayFailure, "10.77.0.2"))], &clock2);
        let g = log2.open_events().find(|e| e.kind == VerdictKind::GrayFailure).unwrap();
        assert_eq!((g.id, g.carried_over, g.confirmed), (1, true, true));
        assert_eq!(g.started_unix_ms, 1_700_000_010_000, "keeps the original start");
        assert_eq!(log2.opened_total(VerdictKind::GrayFailure), 0, "not counted as a new verdict");
        // The straggler is not raised within 3 windows: closed as not confirmed.
        assert!(!log2.end_window(&clock2));
        assert!(!log2.end_window(&clock2));
        assert!(log2.end_window(&clock2));
        let closed = log2.recent_closed().next().unwrap();
        assert_eq!((closed.id, closed.end_reason), (2, Some(EventEnd::NotConfirmed)));
        // The gray failure, confirmed, stays open; new events get new ids.
        assert_eq!(log2.open_events().map(|e| e.id).collect::<Vec<_>>(), vec![1]);
        log2.apply(&[VerdictChange::Opened(verdict(7, VerdictKind::Congestion, "10.77.0.9"))], &clock2);
        assert_eq!(log2.open_events().map(|e| e.id).max(), Some(3));
        // Closing the confirmed event by its new verdict id works.
        let mut v = verdict(1, VerdictKind::GrayFailure, "10.77.0.2");
        v.end_reason = Some(EndReason::Cleared);
        v.ended_ns = Some(6_000_000_000);
        log2.apply(&[VerdictChange::Closed(v)], &clock2);
        assert!(log2.open_events().all(|e| e.id != 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_or_missing_state_file_is_a_fresh_start() {
        let dir = tempdir("corrupt");
        assert!(load(&dir).unwrap().is_none(), "missing file: nothing to carry over");
        std::fs::write(state_path(&dir), b"{\"version\": 1, \"open\": [tru").unwrap();
        let e = load(&dir).unwrap_err();
        assert!(matches!(e, StateFileError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("corrupt") && e.to_string().contains("starting with no carried-over events"), "{e}");
        assert!(!state_path(&dir).exists() && dir.join("events.json.corrupt").exists(), "moved aside");
        // Then a fresh save works.
        save(&dir, &EventLog::new(1, 1).persisted(0)).unwrap();
        assert_eq!(load(&dir).unwrap().unwrap().open.len(), 0);
        // A file of another version is corrupt too.
        std::fs::write(state_path(&dir), b"{\"version\": 99, \"saved_unix_ms\": 0, \"next_id\": 1, \"open\": []}").unwrap();
        assert!(load(&dir).unwrap_err().to_string().contains("version 99"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    pub(crate) fn tempdir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "ringside-events-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
