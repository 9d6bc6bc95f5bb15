"""The README's "Evolve a memory for your own agent" section runs as written.

Its bash block is run line by line, unchanged, by bash in a prepared world: ``$HOME`` holds a
small ChatGPT export at ``~/Downloads/chatgpt-export.zip`` (seven chats, one with an edited
message whose abandoned branch must not be imported); ``openai/gpt-4o-mini`` is routed by
litellm's own environment variables to the fake model server, which answers ``evolve synth``'s
prompts by the plain rule of :func:`synth_model`; ``$PRISMEM_DATA`` is a data root cut from the
real one (:func:`evolve.datasets.slices.write_slice`: the BEAM-500K guard conversations, each
cut to a few messages), so the run's BEAM guard reads real BEAM text in seconds;
``$PRISMEM_CACHE`` is empty. Every line must succeed, the run must have evaluated its seed on
both guards, and the exported program must open a store.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from evolve.datasets import beam
from evolve.datasets.slices import write_slice
from evolve.datasets.userformat import read_dataset
from evolve.evolution.store import RunStore
from evolve.models.fake_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Evolve a memory for your own agent"
FACTS = ("I moved to Lisbon in May 2024.", "My sister Ana plays the cello.",
         "I prefer green tea over coffee.", "My dog Bruno is a beagle.",
         "I started learning Rust in March.", "My flight to Oslo is on June 3.",
         "I work at a bakery on weekends.")  # fmt: skip
ABANDONED = "I moved to Porto in May 2024."  # the first wording of an edited message


def readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for line in block.splitlines() if line.strip()]


def _node(nid: str, role: str, text: str, when: float, parent: str, children: list[str]) -> dict:
    message = {"id": nid, "author": {"role": role}, "create_time": when,
               "content": {"content_type": "text", "parts": [text]}, "metadata": {}}  # fmt: skip
    return {"id": nid, "message": message, "parent": parent, "children": children}


def chatgpt_export(path: Path) -> None:
    """Seven chats a week apart, each a fact and its acknowledgement; in the first, the user
    edited the message (the abandoned wording stays in the tree as a sibling)."""
    chats = []
    for i, fact in enumerate(FACTS):
        when = 1_714_000_000 + i * 7 * 86_400
        mapping: dict[str, Any] = {
            f"{i}r": {"id": f"{i}r", "message": None, "parent": None, "children": [f"{i}u"]},
            f"{i}u": _node(f"{i}u", "user", f"{fact} Please remember it.", when, f"{i}r",
                           [f"{i}a"]),
            f"{i}a": _node(f"{i}a", "assistant", f"Noted: {fact}", when + 5, f"{i}u", []),
        }  # fmt: skip
        if i == 0:
            mapping[f"{i}r"]["children"].insert(0, "0old")
            mapping["0old"] = _node("0old", "user", ABANDONED, when - 60, "0r", [])
        chats.append(
            {
                "id": f"chat{i}",
                "title": f"chat {i}",
                "create_time": when,
                "update_time": when + 5,
                "mapping": mapping,
                "current_node": f"{i}a",
            }
        )
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("conversations.json", json.dumps(chats))


def synth_model(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    """A model for ``evolve synth``'s prompts: per window, one factual question about each user
    message shown, answered by its own words and citing it; every check passes it (supported,
    not changed later, not known without the history, not the same answer)."""
    prompt = str(next(m for m in messages if m["role"] == "user")["content"])
    if prompt.startswith("You write probing questions"):
        if not re.search(r"^Write \d+ factual question", prompt, re.MULTILINE):
            return json.dumps({"questions": []})
        shown = re.findall(r"^\[([^\]]+)\] user: (.*?) Please remember it\.$", prompt, re.M)
        return json.dumps({"questions": [
            {"question": f"What did I tell you in message {mid}?", "answer": fact,
             "evidence": [mid]} for mid, fact in shown]})  # fmt: skip
    if prompt.startswith("You check a question"):
        return json.dumps({"supported": True, "reason": "the message says so"})
    if prompt.startswith("A question about a user's conversation history"):
        return json.dumps({"changed": False, "reason": "nothing later"})
    if prompt.startswith("Answer this question"):
        return json.dumps({"answer": "unknown"})
    return json.dumps({"same": False, "reason": "different"})


def test_the_readme_section_runs_as_written(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    lines = readme_lines()
    assert len(lines) == 5
    home, work = tmp_path / "home", tmp_path / "work"
    chatgpt_export(home / "Downloads" / "chatgpt-export.zip")
    work.mkdir()
    root = write_slice(data_dir, tmp_path / "data", refs=beam.split_refs("guard"))
    with FakeModelServer(synth_model) as server:
        for name, value in (("HOME", home), ("PRISMEM_DATA", root), ("PYTHONPATH", ROOT),
                            ("PRISMEM_CACHE", tmp_path / "cache"), ("OPENAI_API_KEY", "not-a-key"),
                            ("OPENAI_API_BASE", server.base_url),
                            ("OPENAI_BASE_URL", server.base_url)):  # fmt: skip
            monkeypatch.setenv(name, str(value))
        for line in lines:
            done = subprocess.run(["bash", "-c", line], cwd=work, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])

    mine = read_dataset(work / "mine")
    texts = [m.content for c in mine.conversations for s in c.sessions for m in s.messages]
    assert len(mine.conversations) == len(FACTS) and ABANDONED not in " ".join(texts)
    kept = [q for q in mine.questions if q.id.startswith("synth/")]
    assert len(kept) == len(FACTS) and all(q.capability == "F" for q in kept)
    (run_id,) = os.listdir(work / "programs")
    seed = RunStore.open(work / "programs", run_id).candidates()[0]
    assert {"guard:jsonl:guard", "guard:beam:guard@1"} <= set(seed.scores)
    assert (work / "best.py").is_file() and (work / "memstore" / "manifest.json").is_file()
