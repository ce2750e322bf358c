//! Writes the `memory_state` fuzz target's seeds into a folder (scripts/fuzz-seeds.py
//! runs it with `fuzz/seeds/memory_state`): a few tokens decoded on two sequences of
//! each micro model's memory (K/V, sliding-window pair, recurrent, hybrid) on the
//! host-only device and saved, the whole memory and one sequence.

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: memory_state_seeds DIR");
        std::process::exit(2);
    };
    let dir = std::path::Path::new(&dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: {}: {e}", dir.display());
        std::process::exit(1);
    }
    for (name, data) in wgllm::fuzz::memory_state_seeds() {
        if let Err(e) = std::fs::write(dir.join(&name), data) {
            eprintln!("error: {}: {e}", dir.join(&name).display());
            std::process::exit(1);
        }
    }
}
