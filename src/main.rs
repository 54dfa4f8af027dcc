//! ferrok: Kubernetes in one executable.

/// mimalloc rather than glibc's malloc: see the note on the dependency in
/// Cargo.toml for the figures that chose it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    ferrok::cli::main()
}
