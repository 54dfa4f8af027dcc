//! Join tokens in k3s' format: `K10<sha256 of the CA bundle>::<credential>`,
//! where the credential is `<user>:<password>` (the server token) or a
//! bootstrap token `<id>.<secret>`; a bare credential (no CA hash) is
//! accepted too, at the cost of trusting the first CA the server shows.

/// A parsed join token.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// The hex SHA-256 the server's CA bundle must have, when the token carries one.
    pub ca_hash: Option<String>,
    /// What is presented to the server as a bearer token.
    pub credential: String,
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken").field("ca_hash", &self.ca_hash).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinTokenError {
    #[error("the token is empty")]
    Empty,
    #[error("the token's CA hash is not 64 hexadecimal digits (expected K10<sha256>::<credential>)")]
    BadHash,
    #[error("the token has a CA hash but no credential after `::`")]
    NoCredential,
}

impl JoinToken {
    pub fn parse(text: &str) -> Result<JoinToken, JoinTokenError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(JoinTokenError::Empty);
        }
        let Some(rest) = text.strip_prefix("K10") else {
            return Ok(JoinToken { ca_hash: None, credential: text.to_string() });
        };
        let (hash, credential) = rest.split_once("::").ok_or(JoinTokenError::BadHash)?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(JoinTokenError::BadHash);
        }
        if credential.is_empty() {
            return Err(JoinTokenError::NoCredential);
        }
        Ok(JoinToken { ca_hash: Some(hash.to_ascii_lowercase()), credential: credential.to_string() })
    }

    /// The secret the server checks: a bootstrap token `<id>.<secret>` as
    /// it is, the password of `<user>:<password>`.
    pub fn bearer(&self) -> &str {
        if is_bootstrap_token(&self.credential) {
            return &self.credential;
        }
        match self.credential.split_once(':') {
            Some((_, password)) if !password.is_empty() => password,
            _ => &self.credential,
        }
    }
}

/// A random bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn new_bootstrap_token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    // 256 is not a multiple of 36: bytes past the last whole round are drawn again.
    let limit = 256 - 256 % ALPHABET.len();
    let mut s = String::with_capacity(23);
    while s.len() < 22 {
        let mut b = [0u8; 1];
        crate::host::random::fill(&mut b);
        if usize::from(b[0]) < limit {
            s.push(char::from(ALPHABET[usize::from(b[0]) % ALPHABET.len()]));
        }
    }
    s.insert(6, '.');
    s
}

/// `[a-z0-9]{6}.[a-z0-9]{16}`, upstream's bootstrap token shape.
pub fn is_bootstrap_token(s: &str) -> bool {
    let ok = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    s.split_once('.').is_some_and(|(id, secret)| ok(id, 6) && ok(secret, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_bootstrap_tokens_have_upstreams_shape() {
        let a = new_bootstrap_token();
        assert!(is_bootstrap_token(&a), "{a}");
        assert_ne!(a, new_bootstrap_token());
    }

    #[test]
    fn formats() {
        let hash = "ab".repeat(32);
        let t = JoinToken::parse(&format!("K10{hash}::server:s3cret")).unwrap();
        assert_eq!(t.ca_hash.as_deref(), Some(hash.as_str()));
        assert_eq!(t.bearer(), "s3cret");
        let t = JoinToken::parse(&format!("K10{hash}::abcdef.0123456789abcdef")).unwrap();
        assert_eq!(t.bearer(), "abcdef.0123456789abcdef");
        let t = JoinToken::parse(" plain\n").unwrap();
        assert_eq!((t.ca_hash.as_deref(), t.bearer()), (None, "plain"));
        assert_eq!(JoinToken::parse("K10abc::x"), Err(JoinTokenError::BadHash));
        assert_eq!(JoinToken::parse(&format!("K10{hash}::")), Err(JoinTokenError::NoCredential));
        assert_eq!(JoinToken::parse(""), Err(JoinTokenError::Empty));
        assert!(!format!("{t:?}", t = JoinToken::parse("secret").unwrap()).contains("secret"));
        assert!(is_bootstrap_token("abcdef.0123456789abcdef"));
        assert!(!is_bootstrap_token("ABCDEF.0123456789abcdef"));
    }
}
