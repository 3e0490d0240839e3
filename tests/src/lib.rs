//! `tests`: cross-crate integration tests of rocmforge; the library part holds shared fixtures.
