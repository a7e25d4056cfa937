"""Neural-network modules with PyTorch / Hugging Face parameter names: torch.nn's layers, Llama and BERT."""
from . import functional
from .bert import BertConfig, BertModel, SentenceEncoder, mean_pooling, sentence_embeddings
from .generate import Session, sample
from .layers import (ELU, GELU, AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d,
                     ConvTranspose2d, Dropout, Flatten, GroupNorm, Hardsigmoid, Hardswish, Identity, LeakyReLU,
                     LogSoftmax, MaxPool2d, Mish, MultiheadAttention, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Softplus,
                     Tanh, TransformerEncoderLayer, Unflatten)
from .llama import (MLP, Attention, Experts, Llama, LlamaConfig, SparseMoE, TransformerBlock, convert_state_dict,
                    gguf_state_dict, rotate_half, swap_halves)
from .module import Embedding, LayerNorm, Linear, Module, ModuleList, RMSNorm, Sequential
from .resnet import (BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50, resnet101, resnet152,
                     resnet_state_dict_from_hf)
from .vit import ViTConfig, ViTModel
from .whisper import WhisperConfig, WhisperForConditionalGeneration, WhisperModel, WhisperSession
