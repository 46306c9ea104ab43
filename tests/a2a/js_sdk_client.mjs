// The official A2A JavaScript SDK (@a2a-js/sdk 1.3.0, A2A 1.0) against a running warden gateway.
//
// Usage: node js_sdk_client.mjs BASE_URL TOKEN BINDING SDK_DIR   (BINDING: JSONRPC or HTTP+JSON;
// SDK_DIR: the npm prefix the SDK is installed under, `<target>/npm/a2a-js-sdk-1.3.0`)
//
// Resolves the card, then: blocking send, get, list, non-blocking send and cancel, a streamed
// send (Task first, ending COMPLETED), the extended card, and a loopback webhook refused. One
// line per check; exits non-zero on the first failure.

import path from "node:path";
import { pathToFileURL } from "node:url";

const [base, token, binding, sdkDir] = process.argv.slice(2);
const dist = pathToFileURL(path.join(sdkDir, "node_modules/@a2a-js/sdk/dist/")).href;
const sdk = await import(dist + "index.js");
const client = await import(dist + "client/index.js");
const { Role, TaskState } = sdk;

function check(ok, what) {
  console.log((ok ? "ok   " : "FAIL ") + what);
  if (!ok) process.exit(1);
}

// Every request carries the bearer token (the card is public, the rest is not).
const authFetch = (url, init = {}) => {
  const headers = new Headers(init.headers || {});
  headers.set("Authorization", `Bearer ${token}`);
  return fetch(url, { ...init, headers });
};

const options = client.ClientFactoryOptions.createFrom(client.ClientFactoryOptions.default, {
  transports: [
    new client.JsonRpcTransportFactory({ fetchImpl: authFetch }),
    new client.RestTransportFactory({ fetchImpl: authFetch }),
  ],
  preferredTransports: [binding],
});
const factory = new client.ClientFactory(options);
const c = await factory.createFromUrl(base);

let n = 0;
const message = (text, prefix = "js") => ({
  messageId: `${prefix}-${process.pid}-${n++}`,
  contextId: "",
  taskId: "",
  role: Role.ROLE_USER,
  parts: [{ content: { $case: "text", value: text }, metadata: undefined, filename: "", mediaType: "" }],
  metadata: undefined,
  extensions: [],
  referenceTaskIds: [],
});
const request = (msg, configuration = undefined) => ({ tenant: "", message: msg, configuration, metadata: undefined });
const isTask = (r) => r && r.status !== undefined && r.id !== undefined;

// blocking send
const done = await c.sendMessage(request(message("write js.txt")));
check(isTask(done), `${binding} send returns a task`);
check(done.status.state === TaskState.TASK_STATE_COMPLETED, `${binding} send completes (${done.status.state})`);
const answer = done.artifacts.flatMap((a) => a.parts).map((p) => (p.content?.$case === "text" ? p.content.value : "")).join("");
check(answer.includes("js.txt"), `${binding} answer artifact: ${JSON.stringify(answer)}`);

// get, list
const got = await c.getTask({ tenant: "", id: done.id, historyLength: 1 });
check(got.id === done.id && got.history.length === 1, `${binding} get honours historyLength (${got.history.length})`);
const listed = await c.listTasks({ tenant: "", contextId: done.contextId, status: 0, pageSize: 10, pageToken: "", historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: false });
check(listed.tasks.some((t) => t.id === done.id), `${binding} list finds the task`);

// non-blocking send, then cancel
const hang = JSON.stringify({ steps: [{ type: "message", text: "working" }, { type: "hang" }] });
const running = await c.sendMessage(
  request(message(hang), { acceptedOutputModes: [], taskPushNotificationConfig: undefined, historyLength: undefined, returnImmediately: true }),
);
check(isTask(running) && running.status.state !== TaskState.TASK_STATE_COMPLETED, `${binding} returnImmediately gives a running task`);
for (let i = 0; i < 100; i++) {
  const t = await c.getTask({ tenant: "", id: running.id, historyLength: undefined });
  if (t.status.state === TaskState.TASK_STATE_WORKING) break;
  await new Promise((r) => setTimeout(r, 50));
}
const canceled = await c.cancelTask({ tenant: "", id: running.id, metadata: undefined });
check(canceled.status.state === TaskState.TASK_STATE_CANCELED, `${binding} cancel (${canceled.status.state})`);

// stream
const cases = [];
let last;
for await (const ev of c.sendMessageStream(request(message("write streamed.txt")))) {
  cases.push(ev.payload?.$case);
  if (ev.payload?.$case === "statusUpdate") last = ev.payload.value.status.state;
}
check(cases[0] === "task", `${binding} stream starts with the task (${cases[0]})`);
check(cases.includes("artifactUpdate"), `${binding} stream carries artifact updates`);
check(last === TaskState.TASK_STATE_COMPLETED, `${binding} stream ends COMPLETED (${cases})`);

// the extended card (the card says it has one; the client fetches it with the token)
const card = await c.getAgentCard();
check(card.skills.some((s) => s.id === "scripted"), `${binding} extended card lists the caller's agents`);

// a webhook on loopback is refused
let refused = false;
try {
  await c.createTaskPushNotificationConfig({ tenant: "", id: "", taskId: done.id, url: "http://127.0.0.1:9/hook", token: "", authentication: undefined });
} catch (e) {
  refused = String(e).includes("refused");
}
check(refused, `${binding} a loopback webhook is refused`);
console.log(`ok   ${binding} all checks`);
