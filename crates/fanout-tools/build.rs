//! Compiles the bench's wire-sink counter (bpf/wire_sink.bpf.c) with fanout-io's recipe.

#[allow(dead_code)] // its `main` is fanout-io's build script
#[path = "../fanout-io/build.rs"]
mod bpf;

fn main() {
    bpf::compile("bpf/wire_sink.bpf.c", "wire_sink.o", "the bench's wire sinks (`bench bulk --sinks wire`)");
}
