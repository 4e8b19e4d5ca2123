//! The compiled XDP program (ebpf/torus_xdp.c), embedded in the binary so `torusd` needs no
//! files beside it, in the two variants the kernel asks for by MTU.

/// The variant of the XDP program to attach to a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Section `xdp`: single-buffer frames, for links whose MTU fits one page.
    Plain,
    /// Section `xdp.frags`: multi-buffer aware, needed for jumbo frames (and the only kind a
    /// veth with a peer MTU above about 3.5 KiB accepts).
    Frags,
}

/// Largest MTU at which the plain variant is used; above it, the frags variant.
pub const PLAIN_MAX_MTU: u32 = 3000;

impl Variant {
    /// The variant a link of this MTU needs.
    pub fn for_mtu(mtu: u32) -> Variant {
        if mtu > PLAIN_MAX_MTU {
            Variant::Frags
        } else {
            Variant::Plain
        }
    }

    /// The ELF section holding the program.
    pub fn section(self) -> &'static str {
        match self {
            Variant::Plain => "xdp",
            Variant::Frags => "xdp.frags",
        }
    }

    /// The ELF object bytes.
    pub fn object(self) -> &'static [u8] {
        match self {
            Variant::Plain => PLAIN,
            Variant::Frags => FRAGS,
        }
    }
}

/// Name of the program function in both objects.
pub const PROGRAM: &str = "torus_xdp";
/// Names of the maps both objects define.
pub const MAPS: [&str; 8] = [
    "xsks", "egress", "ports", "links", "transit", "routes", "counters", "fault",
];

static PLAIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/torus_xdp.o"));
static FRAGS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/torus_xdp_frags.o"));

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn objects_are_bpf_elf_with_their_sections() {
        for v in [Variant::Plain, Variant::Frags] {
            let o = v.object();
            assert_eq!(&o[..4], b"\x7fELF");
            // e_machine at offset 18 is EM_BPF (247), little-endian.
            assert_eq!(u16::from_le_bytes([o[18], o[19]]), 247);
            assert!(contains(o, v.section().as_bytes()));
            assert!(contains(o, PROGRAM.as_bytes()));
            for m in MAPS {
                assert!(contains(o, m.as_bytes()), "{m} missing");
            }
        }
        assert!(!contains(Variant::Plain.object(), b"xdp.frags"));
        assert_eq!(Variant::for_mtu(1500), Variant::Plain);
        assert_eq!(Variant::for_mtu(9000), Variant::Frags);
    }
}
