// The page: mode picker, settings, status panel, and the chat / duplex views.

import { decodeFileTo16k } from "./audio.js";
import { ChatView } from "./chat.js";
import { DuplexView } from "./duplex.js";
import { float32ToBase64 } from "./pcm.js";
import { StatusPanel } from "./status.js";

const $ = (id) => document.getElementById(id);
const STORED = ["system-prompt", "streaming", "tts", "max-new-tokens", "temperature", "top-p", "length-penalty"];

async function loadConfig() {
  try {
    const r = await fetch("/web/config", { cache: "no-store" });
    if (r.ok) return await r.json();
  } catch {
    // the defaults below are the spec's
  }
  return { duration_limits_s: { chat: 600, video: 300, audio: 600 }, context_tokens: 8192 };
}

// ---------------------------------------------------------------------- settings
function restoreSettings() {
  $("api-key").value = sessionStorage.getItem("omniserve.api-key") || "";
  for (const id of STORED) {
    const v = localStorage.getItem(`omniserve.${id}`);
    if (v == null) continue;
    const el = $(id);
    if (el.type === "checkbox") el.checked = v === "true";
    else el.value = v;
  }
  $("api-key").addEventListener("change", () =>
    sessionStorage.setItem("omniserve.api-key", $("api-key").value.trim()),
  );
  for (const id of STORED) {
    $(id).addEventListener("change", () => {
      const el = $(id);
      localStorage.setItem(`omniserve.${id}`, el.type === "checkbox" ? el.checked : el.value);
    });
  }
}

function number(id, fallback) {
  const el = $(id);
  const v = Number(el.value);
  return el.value !== "" && Number.isFinite(v) ? v : fallback;
}

const voice = { pcm: null, name: "" };

async function onVoiceFile(status) {
  const file = $("voice-file").files[0];
  if (!file) return;
  try {
    voice.pcm = await decodeFileTo16k(file);
    voice.name = file.name;
    $("voice-info").textContent = `${file.name}, ${(voice.pcm.length / 16000).toFixed(1)} s`;
    $("voice-clear").hidden = false;
  } catch {
    voice.pcm = null;
    status.notice("That file could not be read as audio. Use a WAV, MP3 or OGG file.", "error");
  }
}

function clearVoice() {
  voice.pcm = null;
  $("voice-file").value = "";
  $("voice-info").textContent = "none (the model's default voice)";
  $("voice-clear").hidden = true;
}

// ---------------------------------------------------------------------- start
async function main() {
  const config = await loadConfig();
  restoreSettings();
  if (config.api_key_required) $("api-key-hint").hidden = false;
  if (config.version) $("version").textContent = `v${config.version}`;

  const status = new StatusPanel(
    {
      state: $("state"),
      queue: $("queue"),
      queuePosition: $("queue-position"),
      queueWait: $("queue-wait"),
      elapsed: $("elapsed"),
      timeBar: $("time-bar"),
      kvMeter: $("kv-meter"),
      kvText: $("kv-text"),
      backend: $("backend"),
      closeReason: $("close-reason"),
      notice: $("notice"),
    },
    config,
  );

  const mode = () => document.querySelector('input[name="mode"]:checked').value;
  const sessionOptions = () => {
    const m = mode();
    const apiKey = $("api-key").value.trim();
    if (m === "chat") return { mode: m, apiKey, initPayload: {} };
    const payload = { config: { length_penalty: number("length-penalty", 1.1) } };
    const prompt = $("system-prompt").value.trim();
    if (prompt) payload.system_prompt = prompt;
    if (voice.pcm) payload.voice = { ref_audio_base64: float32ToBase64(voice.pcm) };
    return { mode: m, apiKey, initPayload: payload };
  };
  const turnOptions = () => {
    const tts = { enabled: $("tts").checked };
    if (tts.enabled && voice.pcm) tts.ref_audio_data = float32ToBase64(voice.pcm);
    return {
      systemPrompt: $("system-prompt").value.trim(),
      streaming: $("streaming").checked,
      generation: {
        max_new_tokens: Math.round(number("max-new-tokens", 256)),
        temperature: number("temperature", 0.7),
        top_p: number("top-p", 0.8),
        length_penalty: number("length-penalty", 1.1),
      },
      tts,
    };
  };
  const lockModes = (busy) => {
    for (const r of document.querySelectorAll('input[name="mode"]')) r.disabled = busy;
  };

  const chat = new ChatView({
    sessionOptions,
    turnOptions,
    status,
    onBusy: () => {},
    els: {
      form: $("chat-form"),
      text: $("chat-text"),
      image: $("chat-image"),
      imageName: $("chat-image-name"),
      send: $("chat-send"),
      talk: $("chat-talk"),
      end: $("chat-end"),
      transcript: $("transcript"),
      played: $("chat-played"),
    },
  });
  const duplex = new DuplexView({
    sessionOptions,
    status,
    onBusy: lockModes,
    els: {
      start: $("duplex-start"),
      stop: $("duplex-stop"),
      interrupt: $("duplex-interrupt"),
      captions: $("captions"),
      level: $("mic-level"),
      sent: $("chunks-sent"),
      framesSent: $("frames-sent"),
      received: $("audio-received"),
      played: $("audio-played"),
      speaking: $("speaking"),
      preview: $("camera-preview"),
      previewBox: $("camera-box"),
    },
  });

  const showMode = () => {
    const m = mode();
    document.body.dataset.mode = m;
    $("chat-panel").hidden = m !== "chat";
    $("duplex-panel").hidden = m === "chat";
    for (const el of document.querySelectorAll("[data-for]")) {
      el.hidden = !el.dataset.for.split(" ").includes(m === "chat" ? "chat" : "duplex");
    }
    $("duplex-title").textContent = m === "video" ? "Video duplex" : "Audio duplex";
    if (m !== "chat") {
      chat.end();
      duplex.setMode(m);
    }
    status.reset(m);
    const url = new URL(location.href);
    url.searchParams.set("mode", m);
    history.replaceState(null, "", url);
  };
  const wanted = new URLSearchParams(location.search).get("mode");
  if (["chat", "audio", "video"].includes(wanted)) $(`mode-${wanted}`).checked = true;
  for (const r of document.querySelectorAll('input[name="mode"]')) {
    r.addEventListener("change", showMode);
  }
  showMode();

  $("voice-file").addEventListener("change", () => onVoiceFile(status));
  $("voice-clear").addEventListener("click", clearVoice);
  clearVoice();
  document.body.dataset.ready = "true";
}

main();
