//! The Reinforge engine: Hugging Face decoder-only models (Llama family, Qwen2) on burn,
//! batched generation for rollouts, and the training-step primitive.
//!
//! Depends on burn (tensors, autodiff, AdamW; its CPU backend, autodiff graph and `gemm`
//! directly for the fused LM head, linears, RMSNorm, RoPE and SwiGLU), `reinforge-kernels` (the rollout engine's packed-weight
//! matmuls, the head's softmax rows) and file-format crates only; it knows nothing
//! of RL, datasets or clusters. Tokenization lives in `reinforge-tokenizer`.

pub mod config;
pub mod decode;
pub mod device;
pub mod encoder;
pub mod error;
mod fused;
pub mod head;
pub mod lora;
pub mod matmul;
pub mod model;
pub mod rmsnorm;
pub mod rollout;
pub mod rope;
pub mod swiglu;
pub mod train;
pub mod value;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use device::DeviceSpec;
pub use encoder::TextEncoder;
pub use error::{EngineError, Result};
pub use lora::{Adapter, LoraConfig};
pub use model::{CausalLm, ForwardInput, Pick, SharedPrompt, Transformer};
pub use decode::Decoder;
pub use rollout::{admit, generate, generate_with, row_seed, stop_token_ids, Completion, Detokenize, FinishReason, GenerationStats, SamplingParams};
pub use train::{reference_gradients, reference_step, token_logprobs, token_logprobs_at, token_logprobs_from, HfModule, PickedLogProbs, OptimConfig, OptimizerState, StepStats, TokenLogProbs, Trainer};
pub use value::ValueModel;
pub use weights::HostTensor;
