//! The hash of the cap table's client keys (a listener's index and an address).
//!
//! std's default hasher, SipHash-1-3, cost about 190 instructions per lookup of such a key
//! under callgrind, and a connection made four: 760 per connection, which a client that
//! opens a connection per request (nginx's `proxy_pass` without upstream keep-alive, ab
//! without `-k`) pays per request. The keys come from clients, so the hash still takes a
//! secret drawn once per table: without it a client choosing its addresses (a /48 of IPv6
//! holds 65,536 /64 keys) could aim them all at one bucket. Each word written is folded into
//! the state by a 64 x 64 -> 128-bit multiply with the secret, whose two halves are xored
//! (the mixing step of wyhash and foldhash).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Makes [`KeyHasher`]s with one secret.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyHash {
    secret: [u64; 2],
}

impl Default for KeyHash {
    /// A new secret, from the system's randomness as std's own hasher seeds itself.
    fn default() -> KeyHash {
        let seed = RandomState::new();
        KeyHash {
            // Odd multipliers, so that no word is folded with zero.
            secret: [seed.hash_one(1u8) | 1, seed.hash_one(2u8) | 1],
        }
    }
}

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher {
            state: self.secret[1],
            secret: self.secret[0],
        }
    }
}

/// One key's hash in progress.
#[derive(Debug)]
pub(super) struct KeyHasher {
    state: u64,
    secret: u64,
}

fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.state = fold(self.state ^ n, self.secret);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        fold(self.state, self.secret.rotate_left(32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    /// How many of `keys` share a bucket of a table of 1,024 with one before them.
    fn collisions(hash: &KeyHash, keys: &[(usize, IpAddr)]) -> usize {
        let mut seen = HashSet::new();
        keys.iter()
            .filter(|k| !seen.insert(hash.hash_one(k) & 1023))
            .count()
    }

    #[test]
    fn neighbouring_addresses_spread_over_the_buckets_and_the_secret_changes_them() {
        let v4: Vec<(usize, IpAddr)> = (0..512u32)
            .map(|i| (0, IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))))
            .collect();
        let v6: Vec<(usize, IpAddr)> = (0..512u128)
            .map(|i| {
                (
                    1,
                    IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | (i << 64))),
                )
            })
            .collect();
        let hash = KeyHash::default();
        // 512 keys into 1,024 buckets: about 110 collide when the buckets are picked at
        // random; a hash that kept the low bits of the address would put all 512 of the
        // /64 prefixes (whose low 64 bits are zero) in one bucket.
        for keys in [&v4, &v6] {
            let n = collisions(&hash, keys);
            assert!(n < 170, "{n} collisions");
        }
        // Another table, another secret: the same key lands elsewhere.
        let other = KeyHash::default();
        let moved = v4
            .iter()
            .filter(|k| hash.hash_one(k) != other.hash_one(k))
            .count();
        assert_eq!(moved, v4.len());
    }
}
