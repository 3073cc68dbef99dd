//! The model's tests on random-weight checkpoints: logits parity with
//! candle-transformers' own `llama` and `qwen2` ([`parity`]). In the crate,
//! not in tests/, so that the blocks they read need not be public.

mod parity;
