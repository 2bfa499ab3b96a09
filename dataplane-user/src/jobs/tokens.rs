//! Tokens and ids: how the agent makes them and what it keeps of them.
//!
//! Invariants:
//! - A token is never stored: only its SHA-256 ([`TokenHash`]). A tenant token is shown once, in
//!   the `201` of its registration; an operator token lives in a file the operator controls.
//! - Tokens are compared in constant time on their hashes ([`subtle::ConstantTimeEq`]).
//! - Tokens and job ids come from the OS CSPRNG (getrandom(2)).
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Prefix of the operator token the agent generates.
pub const OPERATOR_TOKEN_PREFIX: &str = "rso_";
/// Prefix of tenant tokens (so secret scanners and people recognise them).
pub const TENANT_TOKEN_PREFIX: &str = "rst_";
/// SHA-256 of a token: what the agent keeps instead of the token.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Even the hash stays out of logs: it is enough to test guesses offline.
        f.write_str("TokenHash(..)")
    }
}

impl TokenHash {
    pub fn of(token: &str) -> Self {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time comparison of two hashes.
    pub fn matches(&self, other: &TokenHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }

    /// Constant-time comparison as a [`subtle::Choice`], to fold over many candidates.
    pub fn ct_eq(&self, other: &TokenHash) -> subtle::Choice {
        self.0.ct_eq(&other.0)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The hash as 64 lowercase hex digits (the jobs state file's form).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A hash from 64 hex digits; `None` for anything else.
    pub fn from_hex(hex: &str) -> Option<Self> {
        // Every byte a hex digit: `from_str_radix` alone would take a sign ("+f").
        if hex.len() != 64 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(TokenHash(out))
    }
}

/// Getting randomness from the OS failed (no token or id could be made).
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed ({0}); check that getrandom(2) or /dev/urandom is available to the agent")]
pub struct RandomnessError(pub getrandom::Error);

fn random_hex(bytes: usize) -> Result<String, RandomnessError> {
    let mut buf = vec![0u8; bytes];
    // The OS CSPRNG directly (getrandom(2)): tokens are credentials, and this needs no seeded
    // generator state in the agent.
    getrandom::getrandom(&mut buf).map_err(RandomnessError)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new token: `prefix` + 32 random bytes in hex (256 bits).
pub fn new_token(prefix: &str) -> Result<String, RandomnessError> {
    Ok(format!("{prefix}{}", random_hex(32)?))
}

/// A new job id: `j-` + 12 hex digits (48 random bits: unique among [`MAX_JOBS`] jobs; secrecy
/// comes from the token, not the id).
pub fn new_job_id() -> Result<String, RandomnessError> {
    Ok(format!("j-{}", random_hex(6)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects() {
        let h = TokenHash::of("rst_x");
        let hex = h.to_hex();
        assert_eq!(hex.len(), 64);
        assert!(TokenHash::from_hex(&hex).unwrap().matches(&h));
        assert!(TokenHash::from_hex(&hex.to_uppercase()).unwrap().matches(&h));
        for bad in ["", &hex[..62], &format!("{hex}00"), &format!("zz{}", &hex[2..]), &format!("+1{}", &hex[2..])] {
            assert!(TokenHash::from_hex(bad).is_none(), "{bad}");
        }
    }
}
