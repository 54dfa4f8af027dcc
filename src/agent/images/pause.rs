//! The sandbox ("pause") image, built in memory: no registry, no tarball.
//!
//! A pod sandbox's first process only has to hold the pod's namespaces,
//! reap the zombies that land on it, and exit cleanly when stopped. Here
//! it is a static ELF executable of about 300 bytes, whose machine code is
//! below for x86_64 and aarch64 (picked by `std::env::consts::ARCH`). It
//! blocks SIGINT, SIGTERM and SIGCHLD with rt_sigprocmask and waits for
//! them with rt_sigtimedwait: as PID 1 of a pid namespace a process ignores
//! signals left at their default disposition, but a blocked signal it
//! waits for is delivered all the same. SIGCHLD reaps every exited child
//! with wait4(-1, NULL, WNOHANG, NULL); SIGINT and SIGTERM exit_group(0).
//!
//! How the bytes were made: the listings in the comments were assembled
//! with GNU as (`as --64` for x86_64, `aarch64-linux-gnu-as` for aarch64),
//! and the `.text` section's bytes taken with `objcopy -O binary -j .text`
//! and checked against `objdump -d`; the program was then linked with
//! `ld` and run natively and under `qemu-aarch64-static`, sent SIGCHLD
//! (it stays up) and SIGTERM (it exits 0). The ELF header and program
//! headers around the code are written by [`elf`] below.
//!
//! The image is one uncompressed layer holding `/pause`, a config with the
//! host's architecture and `Entrypoint: ["/pause"]`, packed as an OCI
//! image layout and imported through the importer like any tarball.

use std::collections::BTreeMap;

use super::import::import_reader;
use super::oci::{self, Descriptor, Index, Manifest};
use super::ImageError;
use crate::agent::cri::{api, Cri, CriError};

/// The pause image every node has without a registry. The tag changes
/// whenever the program or the image's shape does.
pub const PAUSE_IMAGE: &str = "ferrok.local/pause:1";

/// The signal set {SIGINT (2), SIGTERM (15), SIGCHLD (17)}: bit n-1 per signal.
pub const PAUSE_SIGNALS: u64 = (1 << 1) | (1 << 14) | (1 << 16);

/// x86_64 (Linux syscall numbers: rt_sigprocmask 14, rt_sigtimedwait 128,
/// wait4 61, exit_group 231). Intel syntax.
#[rustfmt::skip]
const CODE_X86_64: &[u8] = &[
    // _start:
    0x68, 0x02, 0x40, 0x01, 0x00,               // push   0x14002          ; the sigset, on the stack
    0x48, 0x89, 0xe6,                           // mov    rsi, rsp         ; set
    0x31, 0xff,                                 // xor    edi, edi         ; SIG_BLOCK
    0x31, 0xd2,                                 // xor    edx, edx         ; oldset = NULL
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00,         // mov    r10d, 8          ; sigsetsize
    0xb8, 0x0e, 0x00, 0x00, 0x00,               // mov    eax, 14          ; rt_sigprocmask
    0x0f, 0x05,                                 // syscall
    0x48, 0x81, 0xec, 0x80, 0x00, 0x00, 0x00,   // sub    rsp, 128         ; siginfo_t buffer
    // wait:
    0x48, 0x8d, 0xbc, 0x24, 0x80, 0x00, 0x00, 0x00, // lea rdi, [rsp+128]  ; set
    0x48, 0x89, 0xe6,                           // mov    rsi, rsp         ; info
    0x31, 0xd2,                                 // xor    edx, edx         ; timeout = NULL
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00,         // mov    r10d, 8
    0xb8, 0x80, 0x00, 0x00, 0x00,               // mov    eax, 128         ; rt_sigtimedwait
    0x0f, 0x05,                                 // syscall
    0x83, 0xf8, 0x11,                           // cmp    eax, 17          ; SIGCHLD
    0x74, 0x0c,                                 // je     reap
    0x83, 0xf8, 0x02,                           // cmp    eax, 2           ; SIGINT
    0x74, 0x23,                                 // je     quit
    0x83, 0xf8, 0x0f,                           // cmp    eax, 15          ; SIGTERM
    0x74, 0x1e,                                 // je     quit
    0xeb, 0xd5,                                 // jmp    wait             ; -EINTR and the like
    // reap:
    0xbf, 0xff, 0xff, 0xff, 0xff,               // mov    edi, -1          ; any child
    0x31, 0xf6,                                 // xor    esi, esi         ; status = NULL
    0xba, 0x01, 0x00, 0x00, 0x00,               // mov    edx, 1           ; WNOHANG
    0x45, 0x31, 0xd2,                           // xor    r10d, r10d       ; rusage = NULL
    0xb8, 0x3d, 0x00, 0x00, 0x00,               // mov    eax, 61          ; wait4
    0x0f, 0x05,                                 // syscall
    0x85, 0xc0,                                 // test   eax, eax
    0x7f, 0xe6,                                 // jg     reap             ; reaped one: try again
    0xeb, 0xb9,                                 // jmp    wait
    // quit:
    0x31, 0xff,                                 // xor    edi, edi
    0xb8, 0xe7, 0x00, 0x00, 0x00,               // mov    eax, 231         ; exit_group(0)
    0x0f, 0x05,                                 // syscall
];

/// aarch64 instructions, one little-endian word each (syscall numbers:
/// rt_sigprocmask 135, rt_sigtimedwait 137, wait4 260, exit_group 94).
#[rustfmt::skip]
const CODE_AARCH64: &[u32] = &[
    // _start:
    0xd2880040, // mov  x0, #0x4002
    0xf2a00020, // movk x0, #0x1, lsl #16     ; x0 = 0x14002, the sigset
    0xf81f0fe0, // str  x0, [sp, #-16]!       ; on the stack (sp stays 16-aligned)
    0xd2800000, // mov  x0, #0                ; SIG_BLOCK
    0x910003e1, // mov  x1, sp                ; set
    0xd2800002, // mov  x2, #0                ; oldset = NULL
    0xd2800103, // mov  x3, #8                ; sigsetsize
    0xd28010e8, // mov  x8, #135              ; rt_sigprocmask
    0xd4000001, // svc  #0
    0xd10203ff, // sub  sp, sp, #128          ; siginfo_t buffer
    // wait:
    0x910203e0, // add  x0, sp, #128          ; set
    0x910003e1, // mov  x1, sp                ; info
    0xd2800002, // mov  x2, #0                ; timeout = NULL
    0xd2800103, // mov  x3, #8
    0xd2801128, // mov  x8, #137              ; rt_sigtimedwait
    0xd4000001, // svc  #0
    0xf100441f, // cmp  x0, #17               ; SIGCHLD
    0x540000c0, // b.eq reap
    0xf100081f, // cmp  x0, #2                ; SIGINT
    0x540001a0, // b.eq quit
    0xf1003c1f, // cmp  x0, #15               ; SIGTERM
    0x54000160, // b.eq quit
    0x17fffff4, // b    wait                  ; -EINTR and the like
    // reap:
    0x92800000, // mov  x0, #-1               ; any child
    0xd2800001, // mov  x1, #0                ; status = NULL
    0xd2800022, // mov  x2, #1                ; WNOHANG
    0xd2800003, // mov  x3, #0                ; rusage = NULL
    0xd2802088, // mov  x8, #260              ; wait4
    0xd4000001, // svc  #0
    0xf100001f, // cmp  x0, #0
    0x54ffff2c, // b.gt reap                  ; reaped one: try again
    0x17ffffeb, // b    wait
    // quit:
    0xd2800000, // mov  x0, #0
    0xd2800bc8, // mov  x8, #94               ; exit_group(0)
    0xd4000001, // svc  #0
];

const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const LOAD_ADDRESS: u64 = 0x40_0000;

/// The pause program for `arch` (`std::env::consts::ARCH` spelling), or
/// None for an architecture without one.
pub fn pause_elf_for(arch: &str) -> Option<Vec<u8>> {
    match arch {
        "x86_64" => Some(elf(EM_X86_64, CODE_X86_64)),
        "aarch64" => {
            let code: Vec<u8> = CODE_AARCH64.iter().flat_map(|w| w.to_le_bytes()).collect();
            Some(elf(EM_AARCH64, &code))
        }
        _ => None,
    }
}

/// The pause program for this host.
pub fn pause_elf() -> Option<Vec<u8>> {
    pause_elf_for(std::env::consts::ARCH)
}

/// A static ELF64 little-endian executable: the header, a PT_LOAD of the
/// whole file (read + execute) and a PT_GNU_STACK (no executable stack),
/// then `code`, entered at its first byte.
fn elf(machine: u16, code: &[u8]) -> Vec<u8> {
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    const PHNUM: u64 = 2;
    let code_offset = EHDR + PHDR * PHNUM;
    let file_size = code_offset + code.len() as u64;
    let mut out = Vec::with_capacity(file_size as usize);
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_SYSV, padding.
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    out.extend_from_slice(&machine.to_le_bytes()); // e_machine
    out.extend_from_slice(&1u32.to_le_bytes()); // e_version
    out.extend_from_slice(&(LOAD_ADDRESS + code_offset).to_le_bytes()); // e_entry
    out.extend_from_slice(&EHDR.to_le_bytes()); // e_phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    out.extend_from_slice(&(EHDR as u16).to_le_bytes()); // e_ehsize
    out.extend_from_slice(&(PHDR as u16).to_le_bytes()); // e_phentsize
    out.extend_from_slice(&(PHNUM as u16).to_le_bytes()); // e_phnum
    out.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
                                    // PT_LOAD, PF_R | PF_X, the whole file at LOAD_ADDRESS (64 KiB aligned for any page size).
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&5u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    out.extend_from_slice(&LOAD_ADDRESS.to_le_bytes()); // p_vaddr
    out.extend_from_slice(&LOAD_ADDRESS.to_le_bytes()); // p_paddr
    out.extend_from_slice(&file_size.to_le_bytes()); // p_filesz
    out.extend_from_slice(&file_size.to_le_bytes()); // p_memsz
    out.extend_from_slice(&0x1_0000u64.to_le_bytes()); // p_align
                                                       // PT_GNU_STACK, PF_R | PF_W.
    out.extend_from_slice(&0x6474_e551u32.to_le_bytes());
    out.extend_from_slice(&6u32.to_le_bytes());
    out.extend_from_slice(&[0; 40]);
    out.extend_from_slice(&16u64.to_le_bytes()); // p_align
    debug_assert_eq!(out.len() as u64, code_offset);
    out.extend_from_slice(code);
    out
}

fn tar_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) -> Result<(), ImageError> {
    let mut h = tar::Header::new_ustar();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut h, path, data)
        .map_err(|e| ImageError::archive("the pause image", format!("cannot build {path}: {e}")))
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ImageError> {
    serde_json::to_vec(value).map_err(|e| ImageError::archive("the pause image", format!("cannot encode: {e}")))
}

/// The pause image for this host as an OCI image-layout tarball, named
/// `reference` (a full reference).
pub fn pause_image_tar(reference: &str) -> Result<Vec<u8>, ImageError> {
    let elf = pause_elf().ok_or_else(|| {
        ImageError::archive("the pause image", format!("no built-in pause program for {}", std::env::consts::ARCH))
    })?;
    let mut layer = tar::Builder::new(Vec::new());
    tar_file(&mut layer, "pause", 0o755, &elf)?;
    let layer = layer.into_inner().map_err(|e| ImageError::archive("the pause image", e.to_string()))?;
    let layer_digest = oci::sha256_digest(&layer);
    let platform = oci::host_platform();
    let mut config = serde_json::json!({
        "architecture": platform.architecture,
        "os": platform.os,
        "config": { "Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/" },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created_by": "ferrok: built-in pause program" }],
    });
    if !platform.variant.is_empty() {
        config["variant"] = serde_json::Value::String(platform.variant.clone());
    }
    let config = json(&config)?;
    let descriptor = |media_type: &str, data: &[u8]| Descriptor {
        media_type: media_type.into(),
        digest: oci::sha256_digest(data),
        size: data.len() as i64,
        ..Default::default()
    };
    let manifest = Manifest {
        schema_version: 2,
        media_type: oci::MEDIA_OCI_MANIFEST.into(),
        config: descriptor(oci::MEDIA_OCI_CONFIG, &config),
        layers: vec![descriptor(oci::MEDIA_OCI_LAYER, &layer)],
        annotations: BTreeMap::new(),
    };
    let manifest = json(&manifest)?;
    let tag = reference.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/')).unwrap_or("latest");
    let mut entry = descriptor(oci::MEDIA_OCI_MANIFEST, &manifest);
    entry.annotations = BTreeMap::from([
        (oci::ANNOTATION_IMAGE_NAME.to_string(), reference.to_string()),
        (oci::ANNOTATION_REF_NAME.to_string(), tag.to_string()),
    ]);
    entry.platform = Some(platform);
    let index = json(&Index {
        schema_version: 2,
        media_type: oci::MEDIA_OCI_INDEX.into(),
        manifests: vec![entry],
        ..Default::default()
    })?;
    let mut out = tar::Builder::new(Vec::new());
    tar_file(&mut out, "oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    tar_file(&mut out, "index.json", 0o644, &index)?;
    for blob in [&layer, &config, &manifest] {
        let hex = oci::sha256_digest(blob).trim_start_matches("sha256:").to_string();
        tar_file(&mut out, &format!("blobs/sha256/{hex}"), 0o644, blob)?;
    }
    out.into_inner().map_err(|e| ImageError::archive("the pause image", e.to_string()))
}

/// Imports the built-in pause image as `reference` unless CRI already has
/// it. Returns whether it was imported.
pub async fn ensure_pause_image(cri: &Cri, reference: &str) -> Result<bool, ImageError> {
    let reference = super::reference::normalize(reference)?;
    let req = api::ImageStatusRequest {
        image: Some(api::ImageSpec { image: reference.clone(), ..Default::default() }),
        verbose: false,
    };
    let present =
        cri.images().image_status(req).await.map_err(CriError::call("ImageStatus"))?.into_inner().image.is_some();
    if present {
        return Ok(false);
    }
    let tar = pause_image_tar(&reference)?;
    import_reader(cri, "the built-in pause image", std::io::Cursor::new(tar)).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    fn run_and_stop(program: &[u8], runner: Option<&str>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pause");
        std::fs::write(&path, program).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = match runner {
            Some(r) => {
                let mut c = std::process::Command::new(r);
                c.arg(&path);
                c
            }
            None => std::process::Command::new(&path),
        };
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(300));
        // SIGCHLD with no child to reap: it stays up.
        unsafe { libc::kill(pid, libc::SIGCHLD) };
        std::thread::sleep(Duration::from_millis(100));
        assert!(child.try_wait().unwrap().is_none(), "pause exited on SIGCHLD");
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert_eq!(status.code(), Some(0), "pause exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "pause ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn pause_program_runs_here_and_exits_0_on_sigterm() {
        let elf = pause_elf().expect("a pause program for this architecture");
        assert!(elf.len() < 400, "{} bytes", elf.len());
        run_and_stop(&elf, None);
    }

    #[test]
    #[ignore = "needs qemu-user-static (the other architecture's program under emulation)"]
    fn pause_program_of_the_other_architecture_runs_under_qemu() {
        let (arch, qemu) = if std::env::consts::ARCH == "x86_64" {
            ("aarch64", "qemu-aarch64-static")
        } else {
            ("x86_64", "qemu-x86_64-static")
        };
        assert!(
            crate::agent::containerd::find_binary(qemu).is_some(),
            "{qemu} is not installed: apt-get install -y qemu-user-static"
        );
        run_and_stop(&pause_elf_for(arch).unwrap(), Some(qemu));
    }

    #[test]
    fn elf_header_points_at_the_code() {
        let elf = pause_elf_for("aarch64").unwrap();
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), EM_AARCH64);
        let entry = u64::from_le_bytes(elf[24..32].try_into().unwrap());
        assert_eq!(entry - LOAD_ADDRESS, 176);
        assert_eq!(&elf[176..180], &0xd2880040u32.to_le_bytes());
    }

    #[test]
    fn pause_image_is_a_named_oci_layout() {
        let tar = pause_image_tar(PAUSE_IMAGE).unwrap();
        let mut archive = tar::Archive::new(std::io::Cursor::new(tar));
        let mut names = Vec::new();
        let mut index = String::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().display().to_string();
            if p == "index.json" {
                std::io::Read::read_to_string(&mut e, &mut index).unwrap();
            }
            names.push(p);
        }
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(index.contains(r#""io.containerd.image.name":"ferrok.local/pause:1""#), "{index}");
        // Deterministic: the same bytes every time.
        assert_eq!(pause_image_tar(PAUSE_IMAGE).unwrap(), pause_image_tar(PAUSE_IMAGE).unwrap());
    }
}
