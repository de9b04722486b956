//! YCSB's number generators, ported from YCSB's Java (`site.ycsb.generator`)
//! onto a seeded PRNG so a run is reproducible: FNV-1a 64 of a number
//! (`Utils.fnvhash64`), the Gray et al. zipfian (`ZipfianGenerator`), its
//! scrambled form (`ScrambledZipfianGenerator`) and the "latest" skew
//! (`SkewedLatestGenerator`).

/// YCSB's default zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// ζ(10¹⁰, 0.99), precomputed by YCSB for the scrambled zipfian.
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;
/// The item count the scrambled zipfian draws from before hashing.
const SCRAMBLED_ITEMS: u64 = 10_000_000_000;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the eight little-endian bytes of
/// `v`, made non-negative as Java's `Math.abs` does.
pub fn fnv_hash64(v: u64) -> u64 {
    const OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut h = OFFSET;
    let mut v = v;
    for _ in 0..8 {
        h ^= v & 0xff;
        h = h.wrapping_mul(PRIME);
        v >>= 8;
    }
    (h as i64).unsigned_abs()
}

/// A small, fast, seeded PRNG (xoshiro256**, seeded through SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut split = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [split(), split(), split(), split()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// ζ(n, θ) summed from item `from` (exclusive count already summed) to `to`.
fn zeta(from: u64, to: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in from..to {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating
/// billion-record synthetic databases", SIGMOD 1994): item 0 is the most
/// popular. The item count may grow between draws; ζ is then extended
/// incrementally, as YCSB does.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    /// Items `0..items` with constant `theta` (YCSB: 0.99).
    pub fn new(items: u64, theta: f64) -> Self {
        let zetan = zeta(0, items, theta, 0.0);
        Self::with_zetan(items, theta, zetan)
    }

    fn with_zetan(items: u64, theta: f64, zetan: f64) -> Self {
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2,
            zetan,
            eta: 0.0,
            count_for_zeta: items,
        };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// A draw in `0..items` (the count given at construction).
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.next_of(rng, self.items)
    }

    /// A draw in `0..items`, extending ζ when `items` grew.
    pub fn next_of(&mut self, rng: &mut Rng, items: u64) -> u64 {
        if items > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, items, self.theta, self.zetan);
            self.count_for_zeta = items;
            self.eta = self.eta_for(items);
        }
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(items.saturating_sub(1));
        }
        let r = (items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(items.saturating_sub(1))
    }
}

/// YCSB's `ScrambledZipfianGenerator`: a zipfian draw over 10¹⁰ items, FNV
/// hashed into `0..items`, so the popular items are scattered over the key
/// space instead of clustered at its start.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    items: u64,
    zipf: Zipfian,
}

impl ScrambledZipfian {
    /// Items `0..items` (positive) with YCSB's constant 0.99.
    pub fn new(items: u64) -> Self {
        ScrambledZipfian {
            items: items.max(1),
            zipf: Zipfian::with_zetan(SCRAMBLED_ITEMS + 1, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// A draw in `0..items`.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        fnv_hash64(self.zipf.next(rng)) % self.items
    }
}

/// YCSB's `SkewedLatestGenerator`: `latest - zipfian(latest)`, so the most
/// recently inserted items are the most popular.
#[derive(Debug, Clone)]
pub struct Latest {
    zipf: Zipfian,
}

impl Latest {
    /// For a key space whose newest item is initially `latest`.
    pub fn new(latest: u64) -> Self {
        Latest {
            zipf: Zipfian::new(latest.max(1), ZIPFIAN_CONSTANT),
        }
    }

    /// A draw in `0..=latest`, skewed towards `latest`.
    pub fn next(&mut self, rng: &mut Rng, latest: u64) -> u64 {
        latest - self.zipf.next_of(rng, latest.max(1)).min(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_ycsb() {
        // FNV-1a 64 of eight zero bytes, as YCSB's fnvhash64(0) computes it.
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for _ in 0..8 {
            h = h.wrapping_mul(1_099_511_628_211);
        }
        assert_eq!(fnv_hash64(0), (h as i64).unsigned_abs());
        assert_ne!(fnv_hash64(1), fnv_hash64(2));
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = Rng::new(1);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            buckets[r.below(10) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "{buckets:?}");
        }
    }

    #[test]
    fn zipfian_item_zero_is_hottest() {
        let mut r = Rng::new(7);
        let mut z = Zipfian::new(1000, ZIPFIAN_CONSTANT);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.next(&mut r) as usize] += 1;
        }
        let max = counts.iter().copied().max().unwrap();
        assert_eq!(counts[0], max);
        // P(0) = 1 / ζ(1000, 0.99) ≈ 0.134.
        let share = counts[0] as f64 / 100_000.0;
        assert!((0.12..0.15).contains(&share), "{share}");
    }

    #[test]
    fn zipfian_grows() {
        let mut r = Rng::new(3);
        let mut z = Zipfian::new(10, ZIPFIAN_CONSTANT);
        let mut seen_high = false;
        for _ in 0..10_000 {
            let v = z.next_of(&mut r, 1000);
            assert!(v < 1000);
            seen_high |= v >= 10;
        }
        assert!(seen_high);
    }
}
