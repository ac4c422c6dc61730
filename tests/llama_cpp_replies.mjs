// Greedy replies of llama.cpp (node-llama-cpp's prebuilt CPU build) to token contexts, for tests/test_gguf_export.py:
//     node llama_cpp_replies.mjs MODEL.gguf CONTEXTS.json   (a JSON list of {"text", "ids", "max_tokens"})
// prints, for each context, how llama.cpp tokenizes its text and the ids it replies to its ids.
import fs from "fs";
import {getLlama} from "node-llama-cpp";

const [modelPath, contextsPath] = process.argv.slice(2);
// One thread: llama.cpp's threads wait for each other by spinning, and node-llama-cpp starts at least 4. On 2 cores
// busy with other work (a warm-up), 4 threads took 225 s for these replies, 1 took 15.
const llama = await getLlama({gpu: false, build: "never", maxThreads: 1});
const model = await llama.loadModel({modelPath});
const answers = [];
for (const {text, ids, max_tokens} of JSON.parse(fs.readFileSync(contextsPath))) {
    const context = await model.createContext({contextSize: 4096});
    const reply = [];
    for await (const token of context.getSequence().evaluate(ids, {temperature: 0})) {
        reply.push(token);
        if (model.isEogToken(token) || reply.length >= max_tokens) break;
    }
    answers.push({tokenized: Array.from(model.tokenize(text, true)), reply});
    await context.dispose();
}
console.log(JSON.stringify(answers));
