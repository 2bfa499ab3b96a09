//! What the agent's HTTP API and its clients decode from the other side (`ringside_client`'s
//! wire types, serde_json as axum's `Json` extractor uses it): the `POST /v1/jobs` registration,
//! the `PUT /v1/jobs/{id}/plan` report, a hint (what a tenant's runtime decodes from the agent),
//! the `limit` query parameter, the names that travel as strings (codec, algorithm, port range),
//! and the report `ringside-ipu` sends its tenant with each managed collective.
//!
//! Input: a selector byte (mod 6: registration, plan report, hint, names, limit, managed report),
//! then the body, query value or name.
//!
//! Checked (module docs of `ringside_client::types`):
//! - a body that decodes serialises back to a value that decodes to the same value (through
//!   `serde_json::Value`, which keeps floats exact), and its JSON text decodes again;
//! - `validate` never panics; an accepted plan report has `chunk_bytes` and `channels` of at least
//!   1 and a valid codec; accepted constraints have a top-k floor in (0, 1];
//! - each name that parses prints as the same string its `Display` gives, which parses again to
//!   the same value, and serialises as that string; a parsed codec is valid, a port range has
//!   `lo <= hi`;
//! - a `limit` that is accepted lies in `1..=MAX_FLOWS_LIMIT`.
#![no_main]

use std::fmt::{Debug, Display};
use std::str::FromStr;

use dataplane_user::api::{parse_limit, MAX_FLOWS_LIMIT};
use ipu_firmware::managed::ManagedReport;
use libfuzzer_sys::fuzz_target;
use ringside_client::{Algorithm, AppliedPlan, Codec, Hint, JobRegistration, PortRange};
use serde::{de::DeserializeOwned, Serialize};

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(body: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(body).ok()?;
    let value = serde_json::to_value(&v).expect("a decoded value serialises");
    let again: T = serde_json::from_value(value).unwrap_or_else(|e| panic!("{v:?} does not decode from its own JSON: {e}"));
    assert_eq!(again, v);
    let text = serde_json::to_vec(&v).expect("a decoded value serialises");
    serde_json::from_slice::<T>(&text).unwrap_or_else(|e| panic!("{v:?} does not decode from its own JSON text: {e}"));
    Some(v)
}

fn name<T: FromStr + Display + Serialize + PartialEq + Debug>(s: &str) -> Option<T> {
    let v: T = s.parse().ok()?;
    let shown = v.to_string();
    assert!(shown.parse::<T>().ok().as_ref() == Some(&v), "{s:?} parsed as {v:?}, shown as {shown:?}, which does not parse back");
    assert_eq!(serde_json::to_value(&v).expect("serialises"), serde_json::Value::String(shown));
    Some(v)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    match which % 6 {
        0 => {
            if let Some(reg) = round_trip::<JobRegistration>(body) {
                if reg.constraints.validate().is_ok() {
                    let r = reg.constraints.min_topk_ratio;
                    assert!(r > 0.0 && r <= 1.0 && reg.constraints.max_channels >= 1, "{reg:?}");
                    assert!(reg.constraints.allows_codec(Codec::None));
                }
                assert!(reg.tcp_ports.iter().chain(&reg.udp_ports).all(|p| p.lo <= p.hi), "{reg:?}");
            }
        }
        1 => {
            if let Some(plan) = round_trip::<AppliedPlan>(body) {
                if plan.validate().is_ok() {
                    assert!(plan.chunk_bytes >= 1 && plan.channels >= 1 && plan.compression.validate().is_ok(), "{plan:?}");
                }
            }
        }
        2 => {
            let _ = round_trip::<Hint>(body);
        }
        3 => {
            let Ok(s) = std::str::from_utf8(body) else { return };
            if let Some(c) = name::<Codec>(s) {
                assert!(c.validate().is_ok(), "{s:?} parsed as the invalid {c:?}");
            }
            let _ = name::<Algorithm>(s);
            if let Some(p) = name::<PortRange>(s) {
                assert!(p.lo <= p.hi, "{s:?}: {p:?}");
            }
        }
        4 => {
            let Ok(s) = std::str::from_utf8(body) else { return };
            if let Ok(n) = parse_limit(Some(s)) {
                assert!((1..=MAX_FLOWS_LIMIT).contains(&n), "{s:?}: {n}");
            }
        }
        _ => {
            let _ = round_trip::<ManagedReport>(body);
        }
    }
});
