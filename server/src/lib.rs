//! `server`: the `rocmforge` binary (every model command), and the home of rocmforge's
//! OpenAI-compatible HTTP server; the top layer of rocmforge.
