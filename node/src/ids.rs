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
