import json
import subprocess
import sys

from evaluation.server import free_port
from tests.conftest import TINY_CORPUS, write_jsonl


def hybrid(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_search_command_prints_json(tiny_index):
    result = hybrid("search", tiny_index, "cat on a mat", "--mode", "bm25", "--k", "2", "--json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [h["id"] for h in body["hits"]][0] == "d1" and len(body["hits"]) == 2


def test_index_command_reports_bad_corpus_line(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [TINY_CORPUS[0], {"_id": "z"}])
    result = hybrid("index", bad, "--out", tmp_path / "idx", "--quiet")
    assert result.returncode == 2
    assert "bad.jsonl:2: missing field 'text'" in result.stderr
    assert not (tmp_path / "idx").exists()


def test_serve_without_index_fails_fast():
    result = hybrid("serve")
    assert result.returncode == 2 and "no index given" in result.stderr


def test_serve_refuses_a_corrupted_index_with_a_clear_message(tiny_index, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_index, broken)
    data = bytearray((broken / "docs.jsonl").read_bytes())
    data[5] ^= 0x01
    (broken / "docs.jsonl").write_bytes(bytes(data))
    result = hybrid("serve", "--index", broken, "--port", free_port())
    assert result.returncode != 0
    assert "docs.jsonl does not match its checksum in the manifest (corrupted)" in result.stdout + result.stderr


def test_index_skip_if_current_rebuilds_only_when_the_corpus_changed(tmp_path, capsys):
    from app.cli import main

    corpus, out = write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS), tmp_path / "index"
    index = ["index", str(corpus), "--out", str(out), "--skip-if-current", "--quiet"]
    assert main(index) == 0 and "indexed 6 documents" in capsys.readouterr().out
    built = (out / "manifest.json").stat()
    assert main(index) == 0 and "build skipped" in capsys.readouterr().out
    assert (out / "manifest.json").stat().st_ino == built.st_ino

    write_jsonl(corpus, TINY_CORPUS[:3])
    assert main(index) == 0 and "indexed 3 documents" in capsys.readouterr().out
