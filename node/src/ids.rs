//! Ids, secrets and clocks chosen by the proposing node (never inside the state machine).

use rand::RngCore;

/// A new id with a type prefix (`mem_`, `bot_`, `tok_`, ...): 16 random bytes in hex.
pub fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    format!("{prefix}_{}", hex::encode(b))
}

/// A new API token secret: 32 random bytes.
pub fn new_secret() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    format!("cdt_{}", hex::encode(b))
}

/// Now, in unix ms.
pub use computerd_actors::now_ms;

/// Whether `id` is of the form `prefix_[A-Za-z0-9_-]+`, at most 100 bytes.
pub fn is_id(id: &str, prefix: &str) -> bool {
    id.len() <= 100
        && id
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('_'))
            .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_distinct() {
        let a = new_id("mem");
        assert!(a.starts_with("mem_") && a.len() == 4 + 32);
        assert_ne!(a, new_id("mem"));
        assert_ne!(new_secret(), new_secret());
    }
}
