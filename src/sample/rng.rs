//! The random numbers llama.cpp's samplers draw: C++'s `std::mt19937` and the way
//! libstdc++ turns its output into `uniform_real_distribution<double>` / `<float>` values
//! on [0, 1).

/// 32-bit Mersenne Twister (MT19937), seeded as `std::mt19937(seed)` is.
#[derive(Clone)]
pub(crate) struct Mt19937 {
    state: [u32; Self::N],
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    const N: usize = 624;
    const M: usize = 397;
    const MATRIX_A: u32 = 0x9908_b0df;
    const UPPER: u32 = 0x8000_0000;
    const LOWER: u32 = 0x7fff_ffff;

    pub(crate) fn new(seed: u32) -> Self {
        let mut state = [0u32; Self::N];
        state[0] = seed;
        for i in 1..Self::N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Self {
            state,
            index: Self::N,
        }
    }

    /// Regenerates the whole state block (the "twist").
    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..Self::N {
            let y = (s[i] & Self::UPPER) | (s[(i + 1) % Self::N] & Self::LOWER);
            let mag = if y & 1 == 0 { 0 } else { Self::MATRIX_A };
            s[i] = s[(i + Self::M) % Self::N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.index >= Self::N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `std::uniform_real_distribution<double>(0, 1)` as libstdc++ computes it
    /// (`generate_canonical<double, 53>`): two 32-bit outputs `a`, `b` give
    /// `(a + b·2³²) / 2⁶⁴`, the sum rounded to a double, and a result of 1 becomes the
    /// largest double below 1.
    pub(crate) fn uniform_f64(&mut self) -> f64 {
        let lo = self.next_u32() as f64;
        let hi = self.next_u32() as f64;
        let sum = lo + hi * 4_294_967_296.0;
        let r = sum / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }

    /// `std::uniform_real_distribution<float>(0, 1)` in libstdc++: one 32-bit output,
    /// rounded to a float, divided by 2³²; 1 becomes the largest float below 1.
    pub(crate) fn uniform_f32(&mut self) -> f32 {
        let x = self.next_u32() as f32;
        let r = x / 4_294_967_296.0f32;
        if r >= 1.0 {
            1.0 - f32::EPSILON / 2.0
        } else {
            r
        }
    }
}
