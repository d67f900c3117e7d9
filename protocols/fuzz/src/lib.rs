//! What the fuzz targets share: cutting an input into the pieces a socket might deliver.

/// Cuts `data` into pieces whose lengths come from a small generator seeded with `seed`:
/// each is `min + (n % modulus)` bytes (the last one shorter). Seed 0 gives one piece, so the
/// fuzzer also tries every input whole. With `min == 0` empty pieces occur, which suits
/// decoders fed record contents rather than sockets.
pub fn pieces(seed: u8, data: &[u8], modulus: u32, min: usize) -> Vec<&[u8]> {
    if seed == 0 {
        return vec![data];
    }
    let mut state = u32::from(seed);
    let mut rest = data;
    let mut out = Vec::new();
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let len = ((state >> 16) % modulus.max(1)) as usize + min;
        let (now, later) = rest.split_at(len.min(rest.len()));
        out.push(now);
        rest = later;
    }
    out
}
