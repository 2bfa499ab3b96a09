//! ringside's API contract: the JSON types of the hints API ([`types`]) and of the operator API
//! ([`operator`]: flows, status, events, jobs), and a small blocking client for both ([`client`]:
//! [`JobClient`], [`HintStream`], [`OperatorClient`]).
//!
//! A *hint* is the plan ringside recommends for one registered job: which allreduce algorithm,
//! chunk size, channel count and wire compression to use from some training step on, with coarse,
//! privacy-safe reasons and a confidence. Hints never name another tenant or the provider's
//! topology. See `docs/tenant-guide.md` for HTTP, server-sent-event and Prometheus consumers.
//!
//! ```no_run
//! use ringside_client::{ClientError, JobClient};
//!
//! fn follow(job_url: &str, token: &str) -> Result<(), ClientError> {
//!     let client = JobClient::new(job_url, token)?; // http://HOST:9464/v1/jobs/ID
//!     println!("current plan: {:?}", client.hint()?);
//!     for item in client.stream()? {
//!         match item {
//!             Ok(hint) => println!("apply v{} from the next step", hint.version),
//!             Err(e) => eprintln!("hint stream: {e}"),
//!         }
//!     }
//!     Ok(()) // the job was deleted
//! }
//! ```
//!
//! This crate is shared by the agent (which serves these types), its CLI (`ringside flows`,
//! `status`, `events`, `jobs`: an [`OperatorClient`]), the emulated training job (which follows
//! the hints) and any Rust trainer that wants to embed the client.

pub mod client;
pub mod fleet;
pub mod operator;
pub mod types;

pub use types::{
    Algorithm, ApiError, AppliedPlan, Codec, APPLIED_PLAN_REFRESH_MS, APPLIED_PLAN_TTL_MS, Constraints, Hint, JobCreated, JobRegistration, JobView, ParseError,
    PortRange,
};
pub use operator::{EventsResponse, FlowsResponse, JobsResponse, StatusResponse};
pub use client::{Backoff, ClientConfig, ClientError, HintStream, JobClient, OperatorClient};
