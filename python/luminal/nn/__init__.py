"""Neural-network modules with Hugging Face parameter names, and the Llama family."""
from .generate import Session, sample
from .llama import (Attention, Llama, LlamaConfig, MLP, TransformerBlock, gguf_state_dict, rotate_half,
                    swap_halves)
from .module import Embedding, LayerNorm, Linear, Module, RMSNorm
