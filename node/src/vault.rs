//! The vault's crypto (issue 41): the cluster's data key, sealing and opening secrets, TOTP.
//!
//! **The data key** is derived from the cluster CA's private key (HKDF-SHA256 over the key's
//! DER, with a label of its own), so it is kept exactly where the CA key is: on the voters,
//! each holding `DIR/tls/ca.key` (0600) from bootstrap or fetched from the leader once promoted
//! (`FetchCaKey`, voters only, over mutual TLS). It is never written to the log or a snapshot,
//! and never to a file of its own. A node that is not a voter has no CA key, so no data key:
//! it cannot seal nor open, and says so (`503`, naming the reason); a secret is then put
//! through, and filled on a Computer linked to, a voter.
//!
//! **Sealing**: ChaCha20-Poly1305 (`ring`), a random 96-bit nonce per value, the associated
//! data binding the sealed value to its vault, name and kind (a sealed value moved to another
//! record does not open). The store keeps `v1.<key id>.<base64(nonce ‖ ciphertext ‖ tag)>`;
//! the key id (4 bytes of HKDF output, hex) names the key a value was sealed under.
//!
//! **TOTP** (RFC 6238): HMAC-SHA1, 30-second steps, 6 digits, the seed in base32 (RFC 4648).
//! The node computes the code; the seed never leaves the node that opens it.

use base64::Engine;
use computerd_proto::browser::SecretText;
use ring::aead;
use ring::hkdf;

/// The most bytes of a clear value.
pub const MAX_VALUE: usize = 4096;
/// The fewest bytes of a clear value (shorter values could not be masked in what the model
/// sees without masking half the page).
pub const MIN_VALUE: usize = 4;

/// A length for HKDF output that is not a key.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The cluster's data key.
pub struct DataKey {
    key: aead::LessSafeKey,
    id: String,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey").field("id", &self.id).finish_non_exhaustive()
    }
}

/// The DER body of a PEM (the base64 between its armour lines).
fn pem_der(pem: &str) -> Result<Vec<u8>, String> {
    let body: String = pem.lines().map(str::trim).filter(|l| !l.starts_with("-----")).collect();
    let der =
        base64::engine::general_purpose::STANDARD.decode(body).map_err(|_| "the CA key is not PEM".to_string())?;
    if der.is_empty() {
        return Err("the CA key is empty".into());
    }
    Ok(der)
}

fn aad(owner: &str, name: &str, kind: &str) -> String {
    format!("computerd secret v1\n{owner}\n{name}\n{kind}")
}

impl DataKey {
    /// The data key of the cluster whose CA private key is `ca_key_pem`.
    pub fn from_ca_key(ca_key_pem: &str) -> Result<Self, String> {
        let der = pem_der(ca_key_pem)?;
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"computerd data key").extract(&der);
        let okm = prk.expand(&[b"secrets v1"], &aead::CHACHA20_POLY1305).map_err(|_| "hkdf".to_string())?;
        let key = aead::LessSafeKey::new(aead::UnboundKey::from(okm));
        let mut id = [0u8; 4];
        prk.expand(&[b"key id v1"], Len(4)).and_then(|o| o.fill(&mut id)).map_err(|_| "hkdf".to_string())?;
        Ok(Self { key, id: hex::encode(id) })
    }

    /// The data key of this node, if it holds the CA's key (a voter); why not otherwise.
    pub fn of_node(pki: &computerd_raft::tls::Pki) -> Result<Self, String> {
        let pem = pki.ca_key_pem().ok_or_else(|| {
            "this node is not a voter and holds no data key, so it cannot seal or open secrets: use a voter (see docs/secrets.md)"
                .to_string()
        })?;
        Self::from_ca_key(&pem)
    }

    /// This key's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Seals `value` for the secret `name` of `owner`'s vault, of `kind`.
    pub fn seal(&self, owner: &str, name: &str, kind: &str, value: &str) -> Result<String, String> {
        let mut nonce = [0u8; aead::NONCE_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| "no randomness for a nonce".to_string())?;
        let mut data = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(aad(owner, name, kind).as_bytes()),
                &mut data,
            )
            .map_err(|_| "sealing failed".to_string())?;
        let mut out = nonce.to_vec();
        out.append(&mut data);
        Ok(format!("v1.{}.{}", self.id, base64::engine::general_purpose::STANDARD_NO_PAD.encode(out)))
    }

    /// Opens a value sealed by [`DataKey::seal`] for the same vault, name and kind.
    pub fn open(&self, owner: &str, name: &str, kind: &str, sealed: &str) -> Result<SecretText, String> {
        let mut parts = sealed.splitn(3, '.');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("the sealed value is malformed".into());
        };
        if id != self.id {
            return Err(format!("the secret was sealed under data key {id}, this cluster's is {}", self.id));
        }
        let raw = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(body)
            .map_err(|_| "the sealed value is malformed".to_string())?;
        if raw.len() < aead::NONCE_LEN + aead::CHACHA20_POLY1305.tag_len() {
            return Err("the sealed value is malformed".into());
        }
        let (nonce, rest) = raw.split_at(aead::NONCE_LEN);
        let nonce = aead::Nonce::try_assume_unique_for_key(nonce).map_err(|_| "the sealed value is malformed")?;
        let mut data = rest.to_vec();
        let clear = self
            .key
            .open_in_place(nonce, aead::Aad::from(aad(owner, name, kind).as_bytes()), &mut data)
            .map_err(|_| "the sealed value does not open for this record".to_string())?;
        let text = String::from_utf8(clear.to_vec()).map_err(|_| "the opened value is not UTF-8".to_string());
        data.iter_mut().for_each(|b| *b = 0);
        text.map(SecretText::new)
    }
}

/// Decodes base32 (RFC 4648; case, spaces and padding ignored).
fn base32(seed: &str) -> Result<Vec<u8>, String> {
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    for c in seed.chars().filter(|c| !c.is_whitespace() && *c != '=' && *c != '-') {
        let v = match c.to_ascii_uppercase() {
            c @ 'A'..='Z' => c as u32 - 'A' as u32,
            c @ '2'..='7' => c as u32 - '2' as u32 + 26,
            _ => return Err("a TOTP seed is base32 (A to Z and 2 to 7)".into()),
        };
        acc = (acc << 5) | v;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Checks a TOTP seed: base32 of at least 10 bytes (80 bits).
pub fn check_totp_seed(seed: &str) -> Result<(), String> {
    let key = base32(seed)?;
    if key.len() < 10 || key.len() > 128 {
        return Err("a TOTP seed is 10 to 128 bytes in base32 (16 to 205 characters)".into());
    }
    Ok(())
}

/// The 6-digit TOTP code of `seed` (base32) at `unix_s` (RFC 6238: HMAC-SHA1, 30 s steps).
pub fn totp(seed: &str, unix_s: u64) -> Result<String, String> {
    let key = base32(seed)?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &key);
    let tag = ring::hmac::sign(&key, &(unix_s / 30).to_be_bytes());
    let h = tag.as_ref();
    let at = (h[h.len() - 1] & 0x0f) as usize;
    let code = u32::from_be_bytes([h[at] & 0x7f, h[at + 1], h[at + 2], h[at + 3]]) % 1_000_000;
    Ok(format!("{code:06}"))
}

/// Checks a value to be put: its length, and for a TOTP seed its form.
pub fn check_value(kind: &str, value: &str) -> Result<(), String> {
    if value.len() < MIN_VALUE || value.len() > MAX_VALUE {
        return Err(format!("a secret's value is {MIN_VALUE} to {MAX_VALUE} bytes"));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err("a secret's value has no control characters (it is typed into a field)".into());
    }
    if kind == "totp" {
        check_totp_seed(value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgq4m2vGqg0mY9t2nH\nKq0gq4m2vGqg0mY9t2nHKq0gq4mhRANCAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n-----END PRIVATE KEY-----\n";

    /// Issue 41, item 1: a value sealed for a record opens for that record only, under the key
    /// every holder of the CA key derives alike.
    #[test]
    fn i41_1_sealed_values_open_for_their_record_only() {
        let k = DataKey::from_ca_key(CA).unwrap();
        let again = DataKey::from_ca_key(&CA.replace('\n', "\n\n")).unwrap();
        assert_eq!(k.id(), again.id(), "the same key from the same CA key, however wrapped");
        let sealed = k.seal("mem_o", "site-a", "password", "hunter2-correct").unwrap();
        assert!(!sealed.contains("hunter2"), "{sealed}");
        assert_ne!(sealed, k.seal("mem_o", "site-a", "password", "hunter2-correct").unwrap(), "a fresh nonce");
        assert_eq!(again.open("mem_o", "site-a", "password", &sealed).unwrap().expose(), "hunter2-correct");
        for (owner, name, kind) in
            [("mem_x", "site-a", "password"), ("mem_o", "site-b", "password"), ("mem_o", "site-a", "text")]
        {
            assert!(k.open(owner, name, kind, &sealed).is_err(), "{owner} {name} {kind}");
        }
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert!(k.open("mem_o", "site-a", "password", &String::from_utf8(tampered).unwrap()).is_err());
        let other = DataKey::from_ca_key(&CA.replace("MIGH", "MIGI")).unwrap();
        assert!(other.open("mem_o", "site-a", "password", &sealed).unwrap_err().contains("data key"));
        assert!(k.open("mem_o", "site-a", "password", "v1.x").is_err());
        assert!(format!("{:?}", k.open("mem_o", "site-a", "password", &sealed).unwrap()).contains("redacted"));
    }

    /// RFC 6238's test vectors (SHA-1, the seed "12345678901234567890"), last 6 digits.
    #[test]
    fn i41_2_totp_matches_rfc_6238() {
        let seed = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ";
        for (t, code) in [(59, "287082"), (1111111109, "081804"), (1234567890, "005924"), (2000000000, "279037")] {
            assert_eq!(totp(seed, t).unwrap(), code, "at {t}");
        }
        assert!(check_totp_seed("not base32!").is_err());
        assert!(check_totp_seed("GEZDGNBV").is_err(), "too short");
        assert!(check_value("totp", seed).is_ok());
        assert!(check_value("password", "abc").is_err());
        assert!(check_value("password", "a\nbcd").is_err());
    }
}
