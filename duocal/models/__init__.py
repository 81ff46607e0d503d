"""Models by name: fetch a known pretrained model into the cache, or resolve any model argument.

    duocal models fetch smollm2-135m-instruct      # prints the folder path last
    duocal models list

Every command that takes a model accepts a known name, a local folder, or a `.gguf` file.
"""

from .fetch import ModelFetchError, fetch_model, models_dir
from .known import KNOWN_MODELS, KnownModel
from .resolve import DEMO_NAME, ModelRef, is_local_path, load_model, load_tokenizer, resolve_model

__all__ = [
    "DEMO_NAME",
    "KNOWN_MODELS",
    "KnownModel",
    "ModelFetchError",
    "ModelRef",
    "fetch_model",
    "is_local_path",
    "load_model",
    "load_tokenizer",
    "models_dir",
    "resolve_model",
]
