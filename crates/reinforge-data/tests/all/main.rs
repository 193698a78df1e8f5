//! Integration tests for reinforge-data (one binary: linking parquet/arrow is slow).

mod common;
mod formats;
mod gen;
mod loader;
mod malformed;
