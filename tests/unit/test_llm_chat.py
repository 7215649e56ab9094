"""usg.ops.llm:chat — messages from named graph values and a template; prompt token counting."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from usg import InputError
from usg.backends.openai import count_prompt_tokens
from usg.ops.llm import chat
from usg.ops.signature import signature_of


def test_system_and_user_templates_are_filled_by_name() -> None:
    out = chat(system="You read {doc_kind}s.", user="Q: {question}", question="total?", doc_kind="invoice")
    assert out == {
        "messages": [
            {"role": "system", "content": "You read invoices."},
            {"role": "user", "content": "Q: total?"},
        ]
    }


def test_ocr_lines_go_ahead_of_the_question() -> None:
    lines = [{"text": "TOTAL 42.00", "score": 0.9, "box": []}, {"text": "Thank you", "score": 0.8, "box": []}]
    (msg,) = chat(question="total?", lines=lines, lines_header="Document:")["messages"]
    assert msg == {"role": "user", "content": "Document:\nTOTAL 42.00\nThank you\n\ntotal?"}


def test_lines_placed_by_the_template_and_capped() -> None:
    (msg,) = chat(user="{question}\n---\n{lines}", question="q", lines=["a", "b", "c"], max_lines=2)["messages"]
    assert msg["content"] == "q\n---\na\nb"


def test_no_lines_read_adds_no_header() -> None:
    (msg,) = chat(question="q", lines=[])["messages"]
    assert msg["content"] == "q"


def test_image_is_a_png_data_url_part() -> None:
    from PIL import Image

    image = np.full((4, 6, 3), 200, np.uint8)
    (msg,) = chat(question="what is it?", image=image)["messages"]
    img_part, text_part = msg["content"]
    assert text_part == {"type": "text", "text": "what is it?"}
    url = img_part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    assert np.array_equal(decoded, image)


def test_unknown_placeholder_names_the_inputs_and_fix() -> None:
    with pytest.raises(InputError, match=r"names \{topic\}, which is not an input of the node .*'question'.*fix: wire"):
        chat(user="{topic}: {question}", question="q")


def test_bad_image_says_what_it_got() -> None:
    with pytest.raises(InputError, match=r"image is float32\[4, 4\], not an HxWx3 uint8 RGB array"):
        chat(question="q", image=np.zeros((4, 4), np.float32))


def test_chat_declares_its_ports() -> None:
    sig = signature_of(chat)
    assert sig is not None and list(sig.outputs) == ["messages"] and "image" in sig.inputs


def test_token_estimate_over_counts_and_says_so() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 30}, {"type": "image_url"}]}]
    tokens, how = count_prompt_tokens(messages, image_tokens=100)
    assert tokens == 10 + 8 + 100  # 30 bytes / 3, one message's template tokens, one image
    assert "estimated" in how and "options.tokenizer" in how
