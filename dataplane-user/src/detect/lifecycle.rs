//! The life of one verdict scope (a link, or a peer for one detector): window history, raise with
//! persistence (k of n), classification, clear with hysteresis.
//!
//! History is two 64-bit masks (bit 0 = latest observed window), so a track's memory is fixed no
//! matter how long it lives. A window is `Anomalous`, `Clean`, or `Ambiguous` (between the raise
//! and the clear thresholds); ambiguous windows neither count towards a raise nor towards a
//! clear, which is the hysteresis.

use std::collections::VecDeque;

use super::config::PersistenceConfig;
use super::verdict::{
    Classification, EndReason, Evidence, Scope, Severity, Verdict, VerdictChange, VerdictKind,
    WindowCount,
};

/// Most windows a raise can look back over.
const MAX_RAISE_N: u32 = 32;
/// Windows summarised in `Evidence::windows`.
const EVIDENCE_WINDOWS: u32 = 10;
/// Closed episodes remembered per track to detect recurrence.
const RECENT_CLOSES: usize = 4;

/// One window's judgement of one scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowState {
    Clean,
    Ambiguous,
    Anomalous { severe: bool },
}

/// A detector's output for one scope and window.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Assessment {
    pub state: WindowState,
    pub severity: Severity,
    /// Only meaningful when anomalous.
    pub evidence: Vec<Evidence>,
    /// Anomalous only on evidence a busy host's CPU can fake (`PersistenceConfig::mild_raise_k`).
    pub mild: bool,
}

impl Assessment {
    pub fn clean() -> Self {
        Self { state: WindowState::Clean, severity: Severity::Info, evidence: Vec::new(), mild: false }
    }

    pub fn ambiguous() -> Self {
        Self { state: WindowState::Ambiguous, severity: Severity::Info, evidence: Vec::new(), mild: false }
    }

    /// Anomalous on this evidence; `mild`: see the field.
    pub fn anomalous(severe: bool, severity: Severity, evidence: Vec<Evidence>, mild: bool) -> Self {
        Self { state: WindowState::Anomalous { severe }, severity, evidence, mild }
    }

    pub fn is_anomalous(&self) -> bool {
        matches!(self.state, WindowState::Anomalous { .. })
    }
}

/// Where and when the window being pushed happened.
pub(crate) struct TrackCtx<'a> {
    pub job: &'a str,
    pub kind: VerdictKind,
    pub scope: &'a Scope,
    pub window_start_ns: u64,
    pub window_end_ns: u64,
}

#[derive(Clone, Debug)]
struct Open {
    verdict: Verdict,
    /// Current run of anomalous windows (ambiguous windows do not break it, clean ones do).
    run: u32,
    longest_run: u32,
    /// Runs of anomalous windows since the raise.
    episodes: u32,
    /// The previous episode on this scope closed less than `recurrence_ns` before this started.
    recurrent: bool,
    last_not_clean_end_ns: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Track {
    anomalous: u64,
    /// Anomalous windows whose assessment was not `mild`.
    strong: u64,
    clean: u64,
    observed: u32,
    /// Start times of the last `MAX_RAISE_N` observed windows, most recent first.
    starts: VecDeque<u64>,
    open: Option<Open>,
    /// `ended_ns` of recently closed verdicts, most recent first.
    recent_closes: VecDeque<u64>,
}

fn mask(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

fn classify(open: &Open, cfg: &PersistenceConfig) -> Classification {
    if open.recurrent || open.episodes >= 2 {
        Classification::Intermittent
    } else if open.longest_run >= cfg.persistent_windows {
        Classification::Persistent
    } else {
        Classification::Transient
    }
}

impl Track {
    pub fn open_verdict(&self) -> Option<&Verdict> {
        self.open.as_ref().map(|o| &o.verdict)
    }

    fn window_count(&self) -> WindowCount {
        let of = self.observed.min(EVIDENCE_WINDOWS);
        WindowCount { anomalous: (self.anomalous & mask(of)).count_ones(), of }
    }

    fn with_windows(&self, mut evidence: Vec<Evidence>) -> Vec<Evidence> {
        let w = self.window_count();
        for e in evidence.iter_mut() {
            e.windows = w;
        }
        evidence
    }

    /// Pushes one observed window. `classify` turns on the gray-failure classification;
    /// `allow_severe` lets one severe window raise.
    pub fn observe(
        &mut self,
        cfg: &PersistenceConfig,
        ctx: &TrackCtx<'_>,
        a: Assessment,
        classify_gray: bool,
        allow_severe: bool,
        next_id: &mut u64,
    ) -> Option<VerdictChange> {
        self.anomalous <<= 1;
        self.strong <<= 1;
        self.clean <<= 1;
        match a.state {
            WindowState::Anomalous { .. } => {
                self.anomalous |= 1;
                self.strong |= u64::from(!a.mild);
            }
            WindowState::Clean => self.clean |= 1,
            WindowState::Ambiguous => {}
        }
        self.observed = self.observed.saturating_add(1);
        self.starts.push_front(ctx.window_start_ns);
        self.starts.truncate(MAX_RAISE_N as usize);

        if self.open.is_some() {
            return self.observe_open(cfg, ctx, a, classify_gray);
        }
        let WindowState::Anomalous { severe } = a.state else {
            return None;
        };
        let n = cfg.raise_n.clamp(1, MAX_RAISE_N);
        let k = cfg.raise_k.clamp(1, n);
        let mut recent = self.anomalous & mask(n);
        if recent.count_ones() < k && !(severe && allow_severe && cfg.raise_on_severe) {
            return None;
        }
        if self.strong & mask(n) == 0 {
            // Only mild evidence lately: it must persist longer.
            let n = cfg.mild_raise_n.clamp(1, MAX_RAISE_N);
            recent = self.anomalous & mask(n);
            if recent.count_ones() < cfg.mild_raise_k.clamp(1, n) {
                return None;
            }
        }
        let oldest = 63 - recent.leading_zeros();
        let started_ns = self.starts.get(oldest as usize).copied().unwrap_or(ctx.window_start_ns);
        let mut run = 0;
        for i in 0..64 {
            let bit = 1u64 << i;
            if self.anomalous & bit != 0 {
                run += 1;
            } else if self.clean & bit != 0 || i >= self.observed {
                break;
            }
        }
        let recurrent = self
            .recent_closes
            .iter()
            .any(|&end| started_ns.saturating_sub(end) <= cfg.recurrence_ns);
        let evidence = self.with_windows(a.evidence);
        let id = *next_id;
        *next_id += 1;
        let mut open = Open {
            verdict: Verdict {
                id,
                job: ctx.job.to_owned(),
                kind: ctx.kind,
                scope: ctx.scope.clone(),
                severity: a.severity,
                classification: None,
                started_ns,
                raised_ns: ctx.window_end_ns,
                ended_ns: None,
                end_reason: None,
                observed_windows: 1,
                anomalous_windows: 1,
                evidence,
            },
            run,
            longest_run: run,
            episodes: 1,
            recurrent,
            last_not_clean_end_ns: ctx.window_end_ns,
        };
        if classify_gray {
            open.verdict.classification = Some(classify(&open, cfg));
        }
        let change = VerdictChange::Opened(open.verdict.clone());
        self.open = Some(open);
        Some(change)
    }

    fn observe_open(
        &mut self,
        cfg: &PersistenceConfig,
        ctx: &TrackCtx<'_>,
        a: Assessment,
        classify_gray: bool,
    ) -> Option<VerdictChange> {
        let windows = self.window_count();
        let clean_streak = self.clean.trailing_ones();
        let open = self.open.as_mut()?;
        let before = (open.verdict.severity, open.verdict.classification);
        open.verdict.observed_windows += 1;
        match a.state {
            WindowState::Anomalous { .. } => {
                open.verdict.anomalous_windows += 1;
                if open.run == 0 {
                    open.episodes += 1;
                }
                open.run += 1;
                open.longest_run = open.longest_run.max(open.run);
                open.verdict.severity = open.verdict.severity.max(a.severity);
                let mut evidence = a.evidence;
                for e in evidence.iter_mut() {
                    e.windows = windows;
                }
                open.verdict.evidence = evidence;
                open.last_not_clean_end_ns = ctx.window_end_ns;
            }
            WindowState::Ambiguous => open.last_not_clean_end_ns = ctx.window_end_ns,
            WindowState::Clean => open.run = 0,
        }
        if classify_gray {
            open.verdict.classification = Some(classify(open, cfg));
        }
        if clean_streak >= cfg.clear_windows.max(1) {
            let mut open = self.open.take()?;
            open.verdict.ended_ns = Some(open.last_not_clean_end_ns);
            open.verdict.end_reason = Some(EndReason::Cleared);
            self.remember_close(open.last_not_clean_end_ns);
            return Some(VerdictChange::Closed(open.verdict));
        }
        if before != (open.verdict.severity, open.verdict.classification) {
            return Some(VerdictChange::Updated(open.verdict.clone()));
        }
        None
    }

    fn remember_close(&mut self, ended_ns: u64) {
        self.recent_closes.push_front(ended_ns);
        self.recent_closes.truncate(RECENT_CLOSES);
    }

    /// Closes an open verdict because its scope disappeared; `last_seen_ns` is the end of the
    /// last window in which it was seen.
    pub fn expire(&mut self, last_seen_ns: u64) -> Option<VerdictChange> {
        let mut open = self.open.take()?;
        open.verdict.ended_ns = Some(last_seen_ns);
        open.verdict.end_reason = Some(EndReason::Expired);
        Some(VerdictChange::Closed(open.verdict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn anomalous(severe: bool) -> Assessment {
        Assessment::anomalous(severe, if severe { Severity::Critical } else { Severity::Warning }, Vec::new(), false)
    }

    /// Feeds states ('A' anomalous, 'm' anomalous on mild evidence only, 'S' severe, 'C' clean,
    /// '?' ambiguous) and returns (window index, change) pairs.
    fn run(pattern: &str, gray: bool) -> Vec<(usize, VerdictChange)> {
        let cfg = PersistenceConfig::default();
        let scope = Scope::Link { link: "eth0".into() };
        let mut track = Track::default();
        let mut next_id = 0;
        let mut out = Vec::new();
        for (i, c) in pattern.chars().enumerate() {
            let a = match c {
                'A' => anomalous(false),
                'm' => Assessment { mild: true, ..anomalous(false) },
                'S' => anomalous(true),
                'C' => Assessment::clean(),
                _ => Assessment::ambiguous(),
            };
            let ctx = TrackCtx {
                job: "j",
                kind: VerdictKind::GrayFailure,
                scope: &scope,
                window_start_ns: i as u64 * S,
                window_end_ns: (i as u64 + 1) * S,
            };
            if let Some(ch) = track.observe(&cfg, &ctx, a, gray, true, &mut next_id) {
                out.push((i, ch));
            }
        }
        out
    }

    #[test]
    fn raises_on_two_of_three_and_not_on_one() {
        assert!(run("CACCACCCAC", false).is_empty());
        let ch = run("CCACA", false);
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].0, 4);
        let VerdictChange::Opened(v) = &ch[0].1 else { panic!("{ch:?}") };
        assert_eq!(v.started_ns, 2 * S, "start is the first anomalous window of the raise");
        assert_eq!(v.raised_ns, 5 * S);
    }

    #[test]
    fn mild_evidence_alone_raises_on_four_of_five() {
        // Two mild windows in three (a CPU-starved rank): nothing; four in five: raised.
        assert!(run("CmmCCmCmCC", false).is_empty());
        let ch = run("CmmCmm", false);
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].0, 5);
        let VerdictChange::Opened(v) = &ch[0].1 else { panic!("{ch:?}") };
        assert_eq!(v.started_ns, S, "start is the first anomalous window of the raise");
        // Stronger evidence in the last three windows: the usual two of three.
        assert_eq!(run("CmA", false).len(), 1);
        assert_eq!(run("CAm", false).len(), 1);
    }

    #[test]
    fn severe_raises_at_once() {
        let ch = run("CCS", false);
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].0, 2);
    }

    #[test]
    fn ambiguous_windows_hold_the_verdict_open() {
        // Raised at 1; '?' does not count as clean; three clean windows close it at 8.
        let ch = run("AA???CCC", false);
        assert_eq!(ch.len(), 2);
        assert_eq!(ch[1].0, 7);
        let VerdictChange::Closed(v) = &ch[1].1 else { panic!("{ch:?}") };
        assert_eq!(v.ended_ns, Some(5 * S), "ends with the last ambiguous window");
        assert_eq!(v.end_reason, Some(EndReason::Cleared));
    }

    #[test]
    fn classification_transient_persistent_intermittent() {
        let classes = |p: &str| -> Vec<Option<Classification>> {
            run(p, true).into_iter().map(|(_, c)| c.verdict().classification).collect()
        };
        use Classification::*;
        assert_eq!(classes("SCCC"), vec![Some(Transient), Some(Transient)]);
        assert_eq!(
            classes("AAAAAACCC"),
            vec![Some(Transient), Some(Persistent), Some(Persistent)]
        );
        assert_eq!(
            classes("AACCAACCC"),
            vec![Some(Transient), Some(Intermittent), Some(Intermittent)]
        );
        // Closed, then back within the recurrence horizon: intermittent from the start.
        assert_eq!(
            classes("SCCCCCSCCC"),
            vec![Some(Transient), Some(Transient), Some(Intermittent), Some(Intermittent)]
        );
    }

    #[test]
    fn expire_closes_with_reason() {
        let cfg = PersistenceConfig::default();
        let scope = Scope::Job;
        let mut track = Track::default();
        let mut id = 0;
        let ctx = TrackCtx {
            job: "j",
            kind: VerdictKind::Congestion,
            scope: &scope,
            window_start_ns: 0,
            window_end_ns: S,
        };
        assert!(track.observe(&cfg, &ctx, anomalous(true), false, true, &mut id).is_some());
        let Some(VerdictChange::Closed(v)) = track.expire(S) else { panic!() };
        assert_eq!(v.end_reason, Some(EndReason::Expired));
        assert!(track.open_verdict().is_none());
    }
}
