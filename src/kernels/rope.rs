//! Rotary position embedding of one row (HF "rotate half" layout).

/// Rotates, in place, the first `heads` heads of `x` (HF "rotate half"
/// layout) by one position's `cos`/`sin` rows (`head_dim / 2` each).
pub(crate) fn rope_row(x: &mut [f32], cos: &[f32], sin: &[f32], head_dim: usize, heads: usize) {
    let half = head_dim / 2;
    for head in x[..heads * head_dim].chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}
