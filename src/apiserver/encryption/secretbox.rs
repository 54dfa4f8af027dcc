//! The `secretbox` provider, as upstream's `storage/value/encrypt/secretbox`:
//! NaCl's XSalsa20-Poly1305 with a 32-byte key, a random 24-byte nonce in
//! front of the box (tag first, as NaCl's `secretbox.Seal`).

use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::XSalsa20Poly1305;

use super::TransformError;

const NONCE: usize = 24;
const OVERHEAD: usize = 16;

#[derive(Clone)]
pub struct SecretBox(XSalsa20Poly1305);

impl SecretBox {
    /// A 32-byte key; None for any other length.
    pub fn new(key: &[u8]) -> Option<SecretBox> {
        (key.len() == 32).then(|| SecretBox(XSalsa20Poly1305::new(key.into())))
    }

    pub fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, TransformError> {
        let mut nonce = [0u8; NONCE];
        crate::host::random::fill(&mut nonce);
        let sealed = self.0.encrypt(&nonce.into(), plain).map_err(|_| TransformError::Corrupt("cannot seal"))?;
        let mut out = Vec::with_capacity(NONCE + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    pub fn open(&self, data: &[u8]) -> Result<Vec<u8>, TransformError> {
        if data.len() < NONCE + OVERHEAD {
            return Err(TransformError::Corrupt("the stored data was shorter than the required size"));
        }
        let (nonce, body) = data.split_at(NONCE);
        let nonce: [u8; NONCE] = nonce.try_into().map_err(|_| TransformError::Corrupt("bad nonce"))?;
        self.0.decrypt(&nonce.into(), body).map_err(|_| TransformError::Corrupt("the box does not open with this key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_authenticates() {
        let b = SecretBox::new(&[3u8; 32]).unwrap();
        let sealed = b.seal(b"top secret").unwrap();
        assert_eq!(sealed.len(), NONCE + OVERHEAD + 10);
        assert_eq!(b.open(&sealed).unwrap(), b"top secret");
        let mut bad = sealed.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(b.open(&bad).is_err());
        assert!(SecretBox::new(&[3u8; 32 - 1]).is_none());
        assert!(SecretBox::new(&[4u8; 32]).unwrap().open(&sealed).is_err());
        assert!(b.open(&sealed[..NONCE + 3]).is_err());
    }

    /// NaCl's own test vector (tests/secretbox.c): key `firstkey`, nonce
    /// `nonce`; the box is the tag, then the ciphertext.
    #[test]
    fn is_nacl_secretbox() {
        let key = [
            0x1b, 0x27, 0x55, 0x64, 0x73, 0xe9, 0x85, 0xd4, 0x62, 0xcd, 0x51, 0x19, 0x7a, 0x9a, 0x46, 0xc7, 0x60, 0x09,
            0x54, 0x9e, 0xac, 0x64, 0x74, 0xf2, 0x06, 0xc4, 0xee, 0x08, 0x44, 0xf6, 0x83, 0x89,
        ];
        let nonce = [
            0x69, 0x69, 0x6e, 0xe9, 0x55, 0xb6, 0x2b, 0x73, 0xcd, 0x62, 0xbd, 0xa8, 0x75, 0xfc, 0x73, 0xd6, 0x82, 0x19,
            0xe0, 0x03, 0x6b, 0x7a, 0x0b, 0x37,
        ];
        // The message's first three bytes (after NaCl's 32 zero bytes).
        let plain = [0xbe, 0x07, 0x5f];
        let sealed = XSalsa20Poly1305::new(&key.into()).encrypt(&nonce.into(), &plain[..]).unwrap();
        // NaCl's ciphertext starts 8e 99 3b, after the 16-byte tag.
        assert_eq!(sealed.len(), 3 + OVERHEAD);
        assert_eq!(&sealed[OVERHEAD..], &[0x8e, 0x99, 0x3b]);
        let mut framed = nonce.to_vec();
        framed.extend_from_slice(&sealed);
        assert_eq!(SecretBox::new(&key).unwrap().open(&framed).unwrap(), plain);
    }
}
