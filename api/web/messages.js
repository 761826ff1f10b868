// What the user reads: server error codes, close reasons and close codes as sentences.
// The codes and reasons are the server's own (protocol.js, made from api/protocol); the sentences
// are this client's.

import { CLOSING_ERRORS, CloseReason, ErrorCode, RESUME_ERRORS } from "./protocol.js";

const ERRORS = {
  [ErrorCode.UNAUTHORIZED]: "The API key was not accepted. Enter a valid key under Settings.",
  [ErrorCode.ORIGIN_NOT_ALLOWED]: "This server does not accept connections from pages of this web site.",
  [ErrorCode.TOO_MANY_CONNECTIONS]: "Too many connections from your address are open. Close one and try again.",
  [ErrorCode.QUEUE_FULL]: "The service is at capacity and its waiting line is full. Please try again in a few minutes.",
  [ErrorCode.WORKER_BUSY]: "Every model worker is busy and this server does not queue. Please try again shortly.",
  [ErrorCode.SERVICE_UNAVAILABLE]: "The service is not ready: no model worker is running. Please try again later.",
  [ErrorCode.WORKER_CONNECT_FAILED]: "A model worker was assigned but did not start. Please try again.",
  [ErrorCode.INFERENCE_ERROR]: "The model could not process the last input. You can go on.",
  [ErrorCode.BACKEND_ERROR]: "The model stopped working for this session.",
  [ErrorCode.OUTPUT_GAP]: "Part of the answer was lost on the way and could not be recovered.",
  [ErrorCode.NOT_READY]: "That was sent before the session was ready.",
  [ErrorCode.SESSION_NOT_FOUND]: "The connection dropped and the session no longer exists on the server.",
  [ErrorCode.RESUME_EXPIRED]: "The connection dropped for too long; the session could not be resumed.",
};

/** A sentence for an `error` server event. */
export function errorText(err) {
  const code = err?.code || "error";
  const known = ERRORS[code];
  if (code === ErrorCode.INVALID_PAYLOAD || code === ErrorCode.MISSING_FIELD) {
    return `The server refused this request: ${err.message || code}.`;
  }
  if (known && code === ErrorCode.INFERENCE_ERROR && err.message) {
    return `${known} (${err.message})`;
  }
  return known || `The server reported a problem: ${err?.message || code}.`;
}

/** Whether an error ends the session (the others are shown and the session goes on). */
export function isFatal(code) {
  return CLOSING_ERRORS.includes(code) || RESUME_ERRORS.includes(code);
}

function minutes(seconds) {
  const m = Math.round(seconds / 60);
  return m >= 1 ? `${m} minute${m === 1 ? "" : "s"}` : `${Math.round(seconds)} seconds`;
}

/** A sentence for a session.closed reason. */
export function closeReasonText(reason, limitS) {
  switch (reason) {
    case CloseReason.USER_STOP:
    case CloseReason.STOPPED:
    case "turn_done":
      return "You ended the session.";
    case CloseReason.TIMEOUT:
      return `The session reached its time limit${limitS ? ` (${minutes(limitS)})` : ""}.`;
    case CloseReason.CONTEXT_FULL:
      return "The conversation filled the model's memory (8192 tokens). Start a new session to go on.";
    case CloseReason.SERVER_SHUTDOWN:
      return "The server is restarting. Start a new session in a moment.";
    case CloseReason.BACKEND_ERROR:
      return "The model failed and the session ended.";
    case CloseReason.ERROR:
      return "An internal server error ended the session.";
    case CloseReason.REPLACED:
      return "This session was continued from another window.";
    // this client's own reasons (realtime.js): no session.closed came
    case "resume_failed":
      return "The connection dropped and the session could not be resumed.";
    case "connection_lost":
      return "The connection to the server was lost.";
    case "server_closed":
      return "The server closed the connection.";
    case ErrorCode.UNAUTHORIZED:
      return "The server refused the API key.";
    case ErrorCode.ORIGIN_NOT_ALLOWED:
      return "The server does not accept connections from this web site.";
    case ErrorCode.TOO_MANY_CONNECTIONS:
      return "Too many connections from your address were open.";
    case ErrorCode.QUEUE_FULL:
    case ErrorCode.WORKER_BUSY:
      return "The server was too busy to take the session.";
    case ErrorCode.SERVICE_UNAVAILABLE:
      return "The service was not ready.";
    case ErrorCode.WORKER_CONNECT_FAILED:
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
