//! Node passwords: the secret a node proves its name with when it joins,
//! so that a second machine cannot take over an existing node's name
//! (k3s' node-password Secrets). The server keeps only a salted
//! PBKDF2-SHA256 hash, in the Secret `kube-system/<node>.node-password.ferrok`
//! (named and labelled here, for the join endpoint that writes it and the
//! controller that removes it with its Node).

use base64::Engine;
use std::num::NonZeroU32;

/// The label each password Secret carries, naming its node.
pub const NODE_LABEL: &str = "ferrok.io/node";

/// The name of a node's password Secret in kube-system.
pub fn secret_name(node: &str) -> String {
    format!("{node}.node-password.ferrok")
}

const ITERATIONS: u32 = 10_000;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD_NO_PAD;

/// A new random password (hex, 32 characters).
pub fn generate() -> String {
    let mut b = [0u8; 16];
    crate::host::random::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn derive(password: &str, salt: &[u8], iterations: NonZeroU32) -> [u8; 32] {
    let mut out = [0u8; 32];
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, iterations, salt, password.as_bytes(), &mut out);
    out
}

/// `pbkdf2-sha256$<iterations>$<salt>$<hash>`.
pub fn hash(password: &str) -> String {
    let mut salt = [0u8; 16];
    crate::host::random::fill(&mut salt);
    let iterations = NonZeroU32::new(ITERATIONS).unwrap_or(NonZeroU32::MIN);
    let h = derive(password, &salt, iterations);
    format!("pbkdf2-sha256${ITERATIONS}${}${}", B64.encode(salt), B64.encode(h))
}

/// Whether `password` matches a hash made by [`hash`] (in constant time).
pub fn verify(password: &str, stored: &str) -> bool {
    let mut parts = stored.trim().split('$');
    let (Some("pbkdf2-sha256"), Some(iter), Some(salt), Some(expected), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(iterations), Ok(salt), Ok(expected)) =
        (iter.parse().ok().and_then(NonZeroU32::new), B64.decode(salt), B64.decode(expected))
    else {
        return false;
    };
    ring::pbkdf2::verify(ring::pbkdf2::PBKDF2_HMAC_SHA256, iterations, &salt, password.as_bytes(), &expected).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hashes_verify_only_their_password() {
        let p = super::generate();
        assert_eq!(p.len(), 32);
        let h = super::hash(&p);
        assert!(h.starts_with("pbkdf2-sha256$10000$"));
        assert!(super::verify(&p, &h));
        assert!(!super::verify("other", &h));
        assert!(!super::verify(&p, "garbage"));
        assert_ne!(super::hash(&p), h, "salted");
    }
}
