//! vrdma device ABI (placeholder until the spec crate lands).
