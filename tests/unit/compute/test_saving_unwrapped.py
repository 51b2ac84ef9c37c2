"""final/ is written without transformers' second unwrapping, which imports deepspeed through accelerate wherever
deepspeed is installed (2.1-2.6 s of a final save): the same files, and transformers left as it was."""

from __future__ import annotations

import torch
import transformers.modeling_utils as modeling_utils
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel
from transformers import BertConfig, BertForSequenceClassification

from corecpu.compute.wrappers import saving_unwrapped
from corecpu.reporting.reporter import export_final


def _model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))


def test_export_final_writes_the_model_without_transformers_unwrapping_it(tmp_path, monkeypatch):
    calls = []

    def through_accelerate(model, recursive=False):
        calls.append(recursive)
        return model

    monkeypatch.setattr(modeling_utils, "unwrap_model", through_accelerate)
    model = _model()
    export_final(tmp_path / "final", model, None, {})
    assert calls == []  # save_pretrained ran with unwrap(), not the one that imports deepspeed
    assert modeling_utils.unwrap_model is through_accelerate  # restored
    saved = load_file(tmp_path / "final/model.safetensors")
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    # and what transformers itself writes is the same
    model.save_pretrained(tmp_path / "plain", safe_serialization=True)
    assert calls == [False]
    assert (tmp_path / "plain/model.safetensors").read_bytes() == (tmp_path / "final/model.safetensors").read_bytes()


def test_inside_unwrapping_is_corecpus_and_recursive_calls_keep_transformers(monkeypatch):
    calls = []
    monkeypatch.setattr(modeling_utils, "unwrap_model", lambda model, recursive=False: calls.append(recursive) or model)
    model = _model()

    class Wrapped(torch.nn.Module):  # DDP's shape without a process group: unwrap() follows DDP's `.module`
        pass

    ddp = DistributedDataParallel.__new__(DistributedDataParallel)
    torch.nn.Module.__init__(ddp)
    ddp.module = model
    with saving_unwrapped():
        assert modeling_utils.unwrap_model(ddp) is model
        assert modeling_utils.unwrap_model(Wrapped()) is not model
        modeling_utils.unwrap_model(model, recursive=True)
    assert calls == [True]


def test_an_error_inside_restores_transformers(monkeypatch):
    def original(model, recursive=False):
        return model

    monkeypatch.setattr(modeling_utils, "unwrap_model", original)
    try:
        with saving_unwrapped():
            raise OSError("disk full")
    except OSError:
        pass
    assert modeling_utils.unwrap_model is original
