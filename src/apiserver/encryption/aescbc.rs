//! The `aescbc` provider, as upstream's `storage/value/encrypt/aes` CBC
//! transformer: AES in CBC mode with PKCS#7 padding, a random 16-byte IV
//! in front of the ciphertext. Keys of 16, 24 or 32 bytes (AES-128/192/256).

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};

use super::TransformError;

const BLOCK: usize = 16;

#[derive(Clone)]
pub enum AesCbc {
    Aes128([u8; 16]),
    Aes192([u8; 24]),
    Aes256([u8; 32]),
}

impl AesCbc {
    /// A key of 16, 24 or 32 bytes; None for any other length.
    pub fn new(key: &[u8]) -> Option<AesCbc> {
        Some(match key.len() {
            16 => AesCbc::Aes128(key.try_into().ok()?),
            24 => AesCbc::Aes192(key.try_into().ok()?),
            32 => AesCbc::Aes256(key.try_into().ok()?),
            _ => return None,
        })
    }

    /// IV followed by the padded ciphertext.
    pub fn seal(&self, plain: &[u8]) -> Vec<u8> {
        let mut iv = [0u8; BLOCK];
        crate::host::random::fill(&mut iv);
        let sealed = match self {
            AesCbc::Aes128(k) => {
                cbc::Encryptor::<aes::Aes128>::new(k.into(), &iv.into()).encrypt_padded_vec_mut::<Pkcs7>(plain)
            }
            AesCbc::Aes192(k) => {
                cbc::Encryptor::<aes::Aes192>::new(k.into(), &iv.into()).encrypt_padded_vec_mut::<Pkcs7>(plain)
            }
            AesCbc::Aes256(k) => {
                cbc::Encryptor::<aes::Aes256>::new(k.into(), &iv.into()).encrypt_padded_vec_mut::<Pkcs7>(plain)
            }
        };
        let mut out = Vec::with_capacity(BLOCK + sealed.len());
        out.extend_from_slice(&iv);
        out.extend_from_slice(&sealed);
        out
    }

    pub fn open(&self, data: &[u8]) -> Result<Vec<u8>, TransformError> {
        if data.len() < BLOCK {
            return Err(TransformError::Corrupt("the stored data was shorter than the required size"));
        }
        let (iv, body) = data.split_at(BLOCK);
        if body.len() % BLOCK != 0 {
            return Err(TransformError::Corrupt("the stored data is not a multiple of the block size"));
        }
        let iv: [u8; BLOCK] = iv.try_into().map_err(|_| TransformError::Corrupt("bad IV"))?;
        let opened = match self {
            AesCbc::Aes128(k) => {
                cbc::Decryptor::<aes::Aes128>::new(k.into(), &iv.into()).decrypt_padded_vec_mut::<Pkcs7>(body)
            }
            AesCbc::Aes192(k) => {
                cbc::Decryptor::<aes::Aes192>::new(k.into(), &iv.into()).decrypt_padded_vec_mut::<Pkcs7>(body)
            }
            AesCbc::Aes256(k) => {
                cbc::Decryptor::<aes::Aes256>::new(k.into(), &iv.into()).decrypt_padded_vec_mut::<Pkcs7>(body)
            }
        };
        opened.map_err(|_| TransformError::Corrupt("invalid PKCS7 data (empty or not padded)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_every_key_size() {
        for len in [16, 24, 32] {
            let c = AesCbc::new(&vec![7u8; len]).unwrap();
            for plain in [&b""[..], b"x", b"exactly16bytes!!", b"{\"kind\":\"Secret\"}"] {
                let sealed = c.seal(plain);
                assert_eq!(sealed.len() % BLOCK, 0);
                assert!(sealed.len() > BLOCK + plain.len());
                assert_eq!(c.open(&sealed).unwrap(), plain);
            }
        }
        assert!(AesCbc::new(&[0u8; 20]).is_none());
    }

    /// Go's crypto/cipher CBC with the same key, IV and PKCS#7 padding (the
    /// NIST SP 800-38A F.2.5 vector's first block, then a padding block).
    #[test]
    fn matches_the_nist_vector() {
        let key = hex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
        let iv = hex("000102030405060708090a0b0c0d0e0f");
        let plain = hex("6bc1bee22e409f96e93d7e117393172a");
        let mut data = iv.clone();
        let body = cbc::Encryptor::<aes::Aes256>::new(key.as_slice().into(), iv.as_slice().into())
            .encrypt_padded_vec_mut::<Pkcs7>(&plain);
        assert_eq!(&body[..16], hex("f58c4c04d6e5f1ba779eabfb5f7bfbd6").as_slice());
        data.extend_from_slice(&body);
        assert_eq!(AesCbc::new(&key).unwrap().open(&data).unwrap(), plain);
    }

    #[test]
    fn refuses_corrupt_data() {
        let c = AesCbc::new(&[1u8; 32]).unwrap();
        assert!(c.open(b"short").is_err());
        let mut sealed = c.seal(b"hello");
        sealed.push(0);
        assert!(c.open(&sealed).is_err());
        let other = AesCbc::new(&[2u8; 32]).unwrap();
        // A wrong key almost always breaks the padding.
        let sealed = c.seal(b"hello world, this is a secret");
        assert_ne!(other.open(&sealed).ok().as_deref(), Some(&b"hello world, this is a secret"[..]));
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
}
