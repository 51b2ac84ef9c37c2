"""Causal-LM examples as token ids with a loss mask: which tokens are training targets. Torch-free (the
tokenizer is passed in).

    tok = tokenize_causal(data, tokenizer, max_seq_len, completion_only_loss=True) -> Tokenized

How each kind becomes tokens (text is tokenized without the tokenizer's special tokens; corecpu adds them):
  text               [BOS] text EOS                     loss on every token
  prompt_completion  [BOS] prompt | completion EOS      prompt and completion tokenized apart and joined,
                                                        so the boundary is exact; loss on the completion and
                                                        EOS (and on the prompt too without completion_only_loss)
  messages           the tokenizer's chat template      loss on the assistant turns (their header from
                                                        add_generation_prompt excluded, their end-of-turn
                                                        included); no EOS added: the template ends each turn
[BOS] is bos_token_id when the tokenizer itself puts it first (its post-processor adds it to "a"),
as Llama's does and GPT-2's does not; a chat template writes its own BOS, if any.
Truncation keeps the first max_seq_len tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from corecpu.data.causal_records import CausalData
from corecpu.errors import CoreCPUError


@dataclass
class Tokenized:
    input_ids: list[list[int]]
    loss_mask: list[list[int]]  # 1 where that token is a training target
    truncated: int  # examples cut at max_seq_len
    # Examples kept although no token past their first is a target (all cut off by truncation):
    # they cost compute and train nothing. Counted, never dropped, so indices keep matching data.rows.
    no_targets: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize_causal(data: CausalData, tokenizer: Any, max_seq_len: int, *,
                    completion_only_loss: bool = True) -> Tokenized:
    if tokenizer.eos_token_id is None:
        raise CoreCPUError("the tokenizer has no EOS token, so examples cannot end; set tokenizer.eos_token (e.g. to "
                           "its end-of-text token) or use a tokenizer that has one")
    if max_seq_len < 2:
        raise CoreCPUError(f"max sequence length {max_seq_len} leaves no token to predict; pass a larger "
                           "--max-seq-len (e.g. 512)")
    if data.kind == "text":
        bos, eos = _bos(tokenizer), [tokenizer.eos_token_id]
        pairs = [(bos + ids + eos, [1] * (len(bos) + len(ids) + 1)) for ids in _encode(tokenizer, list(data.rows))]
    elif data.kind == "prompt_completion":
        bos, eos = _bos(tokenizer), [tokenizer.eos_token_id]
        prompts = _encode(tokenizer, [p for p, _ in data.rows])
        completions = _encode(tokenizer, [c for _, c in data.rows])
        head = 0 if completion_only_loss else 1
        pairs = [(bos + p + c + eos, [head] * (len(bos) + len(p)) + [1] * (len(c) + 1))
                 for p, c in zip(prompts, completions)]
    elif data.kind == "messages":
        if not getattr(tokenizer, "chat_template", None):
            raise CoreCPUError(f"data '{data.source}' holds conversations (messages) but the tokenizer has no chat "
                               "template to render them; use a tokenizer with a chat template (an instruct/chat "
                               "model's) or data with prompt/completion columns")
        pairs = [_conversation(tokenizer, conv, completion_only_loss, f"data '{data.source}' example {i}")
                 for i, conv in enumerate(data.rows, 1)]
    else:
        raise CoreCPUError(f"unknown causal data kind {data.kind!r}; read the data with read_causal_data")
    ids = [p[0][:max_seq_len] for p in pairs]
    mask = [p[1][:max_seq_len] for p in pairs]
    return Tokenized(ids, mask, truncated=sum(len(p[0]) > max_seq_len for p in pairs),
                     no_targets=sum(not any(m[1:]) for m in mask))


def _encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def _bos(tokenizer: Any) -> list[int]:
    """[bos_token_id] when the tokenizer's own special tokens start with it, else []: ask it, since the
    add_bos_token attribute is not set the same way by every tokenizer class."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    return [bos] if tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos] else []


def _render(tokenizer: Any, turns: Sequence[tuple[str, str]], generation_prompt: bool, where: str) -> list[int]:
    messages = [{"role": role, "content": content} for role, content in turns]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # noqa: BLE001 - Jinja raises whatever the template raises (e.g. raise_exception)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CoreCPUError(f"{where}: the tokenizer's chat template cannot render the first {len(turns)} messages "
                           f"({first}); fix the conversation or use data with prompt/completion columns") from None
    # The template writes its own special tokens (a BOS, turn markers); adding the tokenizer's would double them.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _conversation(tokenizer: Any, turns: Sequence[tuple[str, str]], completion_only_loss: bool,
                  where: str) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one conversation. An assistant turn's tokens lie between the rendering of the
    turns before it with the generation prompt (its header) and the rendering up to and including it."""
    ids = _render(tokenizer, turns, False, where)
    if not completion_only_loss:
        return ids, [1] * len(ids)
    mask = [0] * len(ids)
    for k, (role, _) in enumerate(turns):
        if role != "assistant":
            continue
        start = _prefix_len(tokenizer, turns[:k], True, ids, where)
        end = _prefix_len(tokenizer, turns[:k + 1], False, ids, where)
        mask[start:end] = [1] * (end - start)
    return ids, mask


def _prefix_len(tokenizer: Any, turns: Sequence[tuple[str, str]], generation_prompt: bool, whole: list[int],
                where: str) -> int:
    ids = _render(tokenizer, turns, generation_prompt, where)
    if whole[:len(ids)] != ids:
        raise CoreCPUError(f"{where}: the chat template's tokens for the first {len(turns)} messages are not a prefix "
                           "of the whole conversation's, so the assistant turns cannot be located; use a template "
                           "that renders earlier turns the same whatever follows, or train on every token "
                           "(completion_only_loss off)")
    return len(ids)
