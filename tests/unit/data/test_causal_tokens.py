"""Tier 1: causal-LM examples as token ids and loss masks (corecpu.data.causal_tokens), with a byte-level BPE
tokenizer trained here (no hub): which tokens each kind trains on, BOS/EOS, truncation, one-line errors."""

from __future__ import annotations

import pytest

from corecpu.data.causal_records import CausalData
from corecpu.data.causal_tokens import tokenize_causal
from helpers.one_line import one_line_error

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["the cat sat on the mat", "hello world how are you", "paris is the capital of france",
          "what is the capital of france", "be brief and answer"]
CHAT = (("system", "be brief"), ("user", "what is the capital of france"), ("assistant", "paris"),
        ("user", "and the cat"), ("assistant", "on the mat"))


def make_tokenizer(*, adds_bos: bool = False, chat_template: str | None = CHATML, eos: str | None = "</s>"):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if adds_bos:  # as Llama's tokenizer does: its post-processor puts BOS first
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=eos, pad_token="<pad>",
                                   chat_template=chat_template)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def enc(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def targets(tokenizer, ids: list[int], mask: list[int]) -> str:
    return tokenizer.decode([t for t, m in zip(ids, mask) if m])


# ---------------------------------------------------------------- the three kinds

def test_text_is_tokens_then_eos_all_trained(tok):
    out = tokenize_causal(CausalData("text", ("the cat sat", "hello"), "t"), tok, 64)
    assert out.input_ids == [enc(tok, "the cat sat") + [2], enc(tok, "hello") + [2]]
    assert out.loss_mask == [[1] * len(ids) for ids in out.input_ids]
    assert (out.truncated, out.no_targets, len(out)) == (0, 0, 2)


def test_bos_only_when_the_tokenizer_itself_adds_it():
    bos_tok = make_tokenizer(adds_bos=True)
    out = tokenize_causal(CausalData("text", ("the cat",), "t"), bos_tok, 64)
    assert out.input_ids == [[1] + enc(bos_tok, "the cat") + [2]]  # one BOS, not two
    pc = tokenize_causal(CausalData("prompt_completion", (("the", " cat"),), "t"), bos_tok, 64)
    assert pc.input_ids[0][0] == 1 and pc.loss_mask[0][0] == 0


def test_prompt_completion_trains_the_completion_and_eos(tok):
    data = CausalData("prompt_completion", (("what is the capital of france?", " paris"),), "t")
    prompt, completion = enc(tok, "what is the capital of france?"), enc(tok, " paris")
    out = tokenize_causal(data, tok, 64)
    assert out.input_ids == [prompt + completion + [2]]
    assert out.loss_mask == [[0] * len(prompt) + [1] * (len(completion) + 1)]
    assert targets(tok, out.input_ids[0], out.loss_mask[0]) == " paris</s>"
    every = tokenize_causal(data, tok, 64, completion_only_loss=False)
    assert every.input_ids == out.input_ids and every.loss_mask == [[1] * len(out.input_ids[0])]


def test_messages_train_the_assistant_turns_only(tok):
    data = CausalData("messages", (CHAT,), "t")
    out = tokenize_causal(data, tok, 256)
    whole = tok.apply_chat_template([{"role": r, "content": c} for r, c in CHAT], tokenize=False)
    assert out.input_ids == [enc(tok, whole)]
    # Each reply and its end-of-turn, without the "<|im_start|>assistant\n" header.
    assert targets(tok, out.input_ids[0], out.loss_mask[0]) == "paris<|im_end|>\non the mat<|im_end|>\n"
    every = tokenize_causal(data, tok, 256, completion_only_loss=False)
    assert every.loss_mask == [[1] * len(out.input_ids[0])]


def test_truncation_keeps_the_first_tokens_and_counts(tok):
    data = CausalData("prompt_completion", (("what is the capital of france", " paris"), ("be", " brief")), "t")
    full = tokenize_causal(data, tok, 64)
    cut = len(enc(tok, "what is the capital of france"))  # the first example keeps its prompt only
    out = tokenize_causal(data, tok, cut)
    assert out.input_ids[0] == full.input_ids[0][:cut] and out.input_ids[1] == full.input_ids[1]
    assert (out.truncated, out.no_targets) == (1, 1) and not any(out.loss_mask[0])
    assert tokenize_causal(data, tok, cut + 1).no_targets == 0  # one completion token left to train on


# ---------------------------------------------------------------- errors

def test_errors(tok):
    text = CausalData("text", ("the cat",), "t")
    one_line_error(lambda: tokenize_causal(text, make_tokenizer(eos=None), 64), "no EOS token",
                   "set tokenizer.eos_token")
    one_line_error(lambda: tokenize_causal(text, tok, 1), "max sequence length 1", "--max-seq-len")
    chat = CausalData("messages", (CHAT,), "chat.jsonl")
    one_line_error(lambda: tokenize_causal(chat, make_tokenizer(chat_template=None), 64),
                   "'chat.jsonl'", "no chat template", "prompt/completion columns")
    # Earlier turns rendered differently once later ones follow: a count of the messages up front.
    counting = make_tokenizer(chat_template="{{ messages|length }} " + CHATML)
    one_line_error(lambda: tokenize_causal(chat, counting, 256), "'chat.jsonl' example 1",
                   "not a prefix of the whole conversation's", "completion_only_loss off")
    assert tokenize_causal(chat, counting, 256, completion_only_loss=False).input_ids  # no prefixes needed
    strict = make_tokenizer(chat_template="{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system "
                                          "messages\nhere') }}{% endif %}" + CHATML)
    one_line_error(lambda: tokenize_causal(chat, strict, 256), "example 1", "cannot render", "no system messages")
