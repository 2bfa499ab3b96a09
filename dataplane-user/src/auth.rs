//! Who may call what: operator tokens (files), and the axum extractors [`Operator`] and
//! [`JobAccess`] that read `Authorization: Bearer <token>`.
//!
//! Rules (DESIGN: "tenant tokens see only their job"):
//! - operator token: every `/v1/...` endpoint; `/metrics`, `/healthz`, `/readyz` and
//!   `/v1/openapi.json` are open (bind the listener to the provider network);
//! - tenant token: only `/v1/jobs/{id}/...` of its own job;
//! - no or unknown token → 401 with `WWW-Authenticate: Bearer`; a tenant token on another job's
//!   id → 403 whether or not that id exists (a tenant cannot probe for other jobs); an unknown id
//!   with the operator token → 404.
//!
//! Operator tokens come from `[api] operator_tokens_file` (one per line) or, without it, from
//! `<state_dir>/operator.token`, which the agent creates (mode 0600) on first start and reuses.
use std::{
    fs,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use axum::{
    extract::{FromRequestParts, Path as UrlPath},
    http::{header, request::Parts, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};

use crate::{
    jobs::tokens::{new_token, RandomnessError, TokenHash, OPERATOR_TOKEN_PREFIX},
    view::AgentView,
};
use ringside_client::ApiError;

/// File name of the generated operator token inside the state directory.
pub const OPERATOR_TOKEN_FILE: &str = "operator.token";
/// Shortest token accepted from an operator tokens file (a guessable token is no boundary).
pub const MIN_TOKEN_LEN: usize = 16;

/// Problems with operator token files.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read operator tokens file {path}: {source}; check [api] operator_tokens_file")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("operator tokens file {path} line {line}: {message}")]
    Invalid { path: PathBuf, line: usize, message: String },
    #[error("operator tokens file {path} holds no token; add one per line (at least {MIN_TOKEN_LEN} characters)")]
    Empty { path: PathBuf },
    #[error("cannot write the operator token to {path}: {source}; check that the state directory (--state-dir) is writable")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Randomness(#[from] RandomnessError),
}

/// Parses an operator tokens file: one token per line, `#` comments and blank lines ignored.
pub fn parse_operator_tokens(text: &str, path: &Path) -> Result<Vec<TokenHash>, TokenFileError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let invalid = |message: String| TokenFileError::Invalid { path: path.to_owned(), line: i + 1, message };
        if t.len() < MIN_TOKEN_LEN {
            return Err(invalid(format!("token is {} characters, use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)", t.len())));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("a token is one word of printable ASCII; put one token per line".into()));
        }
        out.push(TokenHash::of(t));
    }
    if out.is_empty() {
        return Err(TokenFileError::Empty { path: path.to_owned() });
    }
    Ok(out)
}

/// Reads an operator tokens file; warns when others may read it.
pub fn load_operator_tokens(path: &Path) -> Result<Vec<TokenHash>, TokenFileError> {
    let text = fs::read_to_string(path).map_err(|source| TokenFileError::Read { path: path.to_owned(), source })?;
    warn_if_world_readable(path);
    parse_operator_tokens(&text, path)
}

fn warn_if_world_readable(path: &Path) {
    if let Ok(m) = fs::metadata(path) {
        if m.permissions().mode() & 0o004 != 0 {
            tracing::warn!(file = %path.display(), "operator tokens file is world-readable: anyone on this host can act as the operator; run `chmod 600 {}`", path.display());
        }
    }
}

/// The operator token in `<state_dir>/operator.token`: reused if present, else generated and
/// written with mode 0600. Returns the file and the token's hash.
pub fn ensure_operator_token(state_dir: &Path) -> Result<(PathBuf, TokenHash), TokenFileError> {
    let path = state_dir.join(OPERATOR_TOKEN_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            warn_if_world_readable(&path);
            let hashes = parse_operator_tokens(&text, &path)?;
            return Ok((path, hashes[0].clone()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(TokenFileError::Read { path, source }),
    }
    let write_err = |source| TokenFileError::Write { path: path.clone(), source };
    fs::create_dir_all(state_dir).map_err(write_err)?;
    let token = new_token(OPERATOR_TOKEN_PREFIX)?;
    // create_new + 0600 at open: the token is never readable by others, not even briefly.
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(write_err)?;
    writeln!(f, "{token}").map_err(write_err)?;
    Ok((path, TokenHash::of(&token)))
}

/// The token of `Authorization: Bearer <token>`, if well-formed.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let v = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A refused request: the JSON error body, and `WWW-Authenticate` on 401.
#[derive(Debug)]
pub struct AuthRejection {
    pub status: StatusCode,
    pub message: String,
}

impl IntoResponse for AuthRejection {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(ApiError { error: self.message })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"ringside\""));
        }
        r
    }
}

fn unauthorized(message: &str) -> AuthRejection {
    AuthRejection { status: StatusCode::UNAUTHORIZED, message: message.to_owned() }
}

const NO_TOKEN: &str = "missing bearer token: send `Authorization: Bearer <token>` (operator token, or the tenant token POST /v1/jobs returned)";
const BAD_TOKEN: &str = "invalid token: use the operator token or the tenant token POST /v1/jobs returned for this job";
const NOT_OPERATOR: &str = "this endpoint needs the operator token; a tenant token only reads /v1/jobs/{id}/... of its own job";
const OTHER_JOB: &str = "this token is not valid for the requested job; use the tenant token of that job";

fn token_hash(parts: &Parts) -> Result<TokenHash, AuthRejection> {
    bearer(parts).map(TokenHash::of).ok_or_else(|| unauthorized(NO_TOKEN))
}

/// The caller holds an operator token.
#[derive(Debug, Clone, Copy)]
pub struct Operator;

impl FromRequestParts<AgentView> for Operator {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AgentView) -> Result<Self, AuthRejection> {
        let h = token_hash(parts)?;
        let catalog = state.catalog();
        if catalog.is_operator(&h) {
            Ok(Operator)
        } else if catalog.is_any_tenant(&h) {
            Err(AuthRejection { status: StatusCode::FORBIDDEN, message: NOT_OPERATOR.to_owned() })
        } else {
            Err(unauthorized(BAD_TOKEN))
        }
    }
}

/// The caller may read job `job_id` (from the `{id}` path segment): its tenant or the operator.
#[derive(Debug, Clone)]
pub struct JobAccess {
    pub job_id: String,
}

impl FromRequestParts<AgentView> for JobAccess {
    type Rejection = AuthRejection;

    async fn from_request_parts(parts: &mut Parts, state: &AgentView) -> Result<Self, AuthRejection> {
        // Authenticate before looking at the id, so an anonymous caller learns nothing about ids.
        let h = token_hash(parts)?;
        let UrlPath(job_id) = UrlPath::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| AuthRejection { status: StatusCode::BAD_REQUEST, message: format!("invalid job id in the path: {e}") })?;
        let catalog = state.catalog();
        if catalog.is_operator(&h) {
            // Config-file jobs have no tenant but are on the hint board.
            if catalog.contains(&job_id) || state.hints.contains(&job_id) {
                return Ok(JobAccess { job_id });
            }
            return Err(AuthRejection { status: StatusCode::NOT_FOUND, message: format!("no job with id `{job_id}`; list them with GET /v1/jobs") });
        }
        if catalog.is_tenant_of(&job_id, &h) {
            return Ok(JobAccess { job_id });
        }
        if catalog.is_any_tenant(&h) {
            // Same answer for another tenant's job and for no job at all.
            return Err(AuthRejection { status: StatusCode::FORBIDDEN, message: OTHER_JOB.to_owned() });
        }
        Err(unauthorized(BAD_TOKEN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::tempdir;

    #[test]
    fn tokens_file_comments_blanks_and_errors_with_lines() {
        let p = Path::new("/etc/ringside/operators");
        let t = parse_operator_tokens("# operators\n\n  0123456789abcdef0123  \n# x\nrso_fedcba9876543210\n", p).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t[0].matches(&TokenHash::of("0123456789abcdef0123")));
        let e = parse_operator_tokens("# c\nshort\n", p).unwrap_err().to_string();
        assert!(e.contains("/etc/ringside/operators line 2") && e.contains("at least 16"), "{e}");
        let e = parse_operator_tokens("0123456789abcdef0123 second-token-on-line\n", p).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("one token per line"), "{e}");
        assert!(parse_operator_tokens("# nothing\n\n", p).unwrap_err().to_string().contains("holds no token"));
    }

    #[test]
    fn generated_operator_token_is_private_and_reused() {
        let dir = tempdir("auth").join("state");
        let (path, h) = ensure_operator_token(&dir).unwrap();
        assert_eq!(path, dir.join(OPERATOR_TOKEN_FILE));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let token = fs::read_to_string(&path).unwrap();
        assert!(token.trim().starts_with(OPERATOR_TOKEN_PREFIX));
        assert!(h.matches(&TokenHash::of(token.trim())));
        let (_, again) = ensure_operator_token(&dir).unwrap();
        assert!(again.matches(&h), "a restart keeps the operator token");
        let _ = fs::remove_dir_all(dir.parent().unwrap());
    }
}
