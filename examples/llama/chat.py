"""Chat with the bundled SmolLM2-135M-Instruct (or any Llama GGUF / safetensors directory) on the CPU.

    python examples/llama/chat.py "Explain how photosynthesis works."
    python examples/llama/chat.py --model path/to/model.gguf --temperature 0.7 --seed 1
"""
from luminal.chat import main

if __name__ == "__main__":
    main()
