// What the user reads: server error codes, close reasons and close codes as sentences.

const ERRORS = {
  unauthorized: "The API key was not accepted. Enter a valid key under Settings.",
  origin_not_allowed: "This server does not accept connections from pages of this web site.",
  too_many_connections: "Too many connections from your address are open. Close one and try again.",
  queue_full: "The service is at capacity and its waiting line is full. Please try again in a few minutes.",
  worker_busy: "Every model worker is busy and this server does not queue. Please try again shortly.",
  service_unavailable: "The service is not ready: no model worker is running. Please try again later.",
  worker_connect_failed: "A model worker was assigned but did not start. Please try again.",
  inference_error: "The model could not process the last input. You can go on.",
  backend_error: "The model stopped working for this session.",
  output_gap: "Part of the answer was lost on the way and could not be recovered.",
  not_ready: "That was sent before the session was ready.",
  session_not_found: "The connection dropped and the session no longer exists on the server.",
  resume_expired: "The connection dropped for too long; the session could not be resumed.",
};

/** A sentence for an `error` server event. */
export function errorText(err) {
  const code = err?.code || "error";
  const known = ERRORS[code];
  if (code === "invalid_payload" || code === "missing_field") {
    return `The server refused this request: ${err.message || code}.`;
  }
  if (known && code === "inference_error" && err.message) {
    return `${known} (${err.message})`;
  }
  return known || `The server reported a problem: ${err?.message || code}.`;
}

/** Whether an error ends the session (the others are shown and the session goes on). */
export function isFatal(code) {
  return [
    "unauthorized",
    "origin_not_allowed",
    "too_many_connections",
    "queue_full",
    "worker_busy",
    "service_unavailable",
    "worker_connect_failed",
    "backend_error",
    "session_not_found",
    "resume_expired",
  ].includes(code);
}

function minutes(seconds) {
  const m = Math.round(seconds / 60);
  return m >= 1 ? `${m} minute${m === 1 ? "" : "s"}` : `${Math.round(seconds)} seconds`;
}

/** A sentence for a session.closed reason. */
export function closeReasonText(reason, limitS) {
  switch (reason) {
    case "user_stop":
    case "stopped":
    case "turn_done":
      return "You ended the session.";
    case "timeout":
      return `The session reached its time limit${limitS ? ` (${minutes(limitS)})` : ""}.`;
    case "context_full":
      return "The conversation filled the model's memory (8192 tokens). Start a new session to go on.";
    case "server_shutdown":
      return "The server is restarting. Start a new session in a moment.";
    case "backend_error":
      return "The model failed and the session ended.";
    case "error":
      return "An internal server error ended the session.";
    case "replaced":
      return "This session was continued from another window.";
    case "resume_failed":
      return "The connection dropped and the session could not be resumed.";
    case "connection_lost":
      return "The connection to the server was lost.";
    case "server_closed":
      return "The server closed the connection.";
    case "unauthorized":
      return "The server refused the API key.";
    case "origin_not_allowed":
      return "The server does not accept connections from this web site.";
    case "too_many_connections":
      return "Too many connections from your address were open.";
    case "queue_full":
    case "worker_busy":
      return "The server was too busy to take the session.";
    case "service_unavailable":
      return "The service was not ready.";
    case "worker_connect_failed":
      return "No worker started the session.";
    default:
      return reason ? `The session ended (${reason}).` : "The session ended.";
  }
}

/** A sentence for a WebSocket close code, when no session.closed arrived. */
export function closeCodeText(code) {
  switch (code) {
    case 1000:
      return "";
    case 1001:
      return "The server is shutting down.";
    case 1003:
      return "The server refused a malformed message.";
    case 1006:
      return "The connection to the server was lost.";
    case 1008:
      return "The server refused the connection (authentication or parameters).";
    case 1009:
      return "A message was too large for the server.";
    case 1011:
      return "The server hit an internal error.";
    case 1013:
      return "The server is busy; try again later.";
    default:
      return code ? `The connection closed (code ${code}).` : "";
  }
}

/** "m:ss" for a number of seconds. */
export function clock(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}
