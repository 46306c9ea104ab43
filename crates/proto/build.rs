//! Generates the gRPC code from `proto/warden/v1/*.proto` and `proto/lf/a2a/v1/a2a.proto` with a vendored `protoc`, so the build
//! needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; setting PROTOC before codegen is the documented way.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "policy.proto",
        "admin.proto",
        "supervisor.proto",
        "approver.proto",
    ]
    .map(|f| root.join("warden/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    // The descriptors of every file, for server reflection on the admin sockets.
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("warden_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        .build_server(true)
        .build_client(true)
        .compile_protos(&files, std::slice::from_ref(&root))?;

    // The A2A 1.0 contract (`lf.a2a.v1`, vendored from the A2A specification) and the minimal
    // `google/api` option declarations it imports.
    let a2a = root.join("lf/a2a/v1/a2a.proto");
    let third_party = root.join("third_party");
    println!("cargo:rerun-if-changed={}", a2a.display());
    println!("cargo:rerun-if-changed={}", third_party.display());
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&[a2a], &[root, third_party])?;
    Ok(())
}
