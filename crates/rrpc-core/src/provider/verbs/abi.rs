//! ABI check: `rdma-sys` declares `ibv_send_wr`, `ibv_wc`, `ibv_ah_attr` and
//! `ibv_gid` by hand (bindgen cannot express their unions). A layout slip
//! there would corrupt every work request silently, so this test compiles a C
//! program against the installed `<infiniband/verbs.h>` and compares sizes and
//! field offsets with the Rust declarations (and the one enum value rrpc-core
//! writes down by hand, `IBV_LINK_LAYER_ETHERNET`, which bindgen does not
//! export from its anonymous enum).

use std::mem::{offset_of, size_of};
use std::process::Command;

use rdma_sys::{
    ibv_ah_attr, ibv_global_route, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr,
    ibv_sge, ibv_wc,
};

const PROBE: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define S(t) printf(#t " %zu\n", sizeof(struct t));
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f));
int main(void) {
  S(ibv_send_wr) O(ibv_send_wr, wr_id) O(ibv_send_wr, next) O(ibv_send_wr, sg_list)
  O(ibv_send_wr, num_sge) O(ibv_send_wr, opcode) O(ibv_send_wr, send_flags)
  O(ibv_send_wr, imm_data) O(ibv_send_wr, wr.rdma.remote_addr) O(ibv_send_wr, wr.rdma.rkey)
  O(ibv_send_wr, qp_type) O(ibv_send_wr, bind_mw)
  S(ibv_sge) O(ibv_sge, addr) O(ibv_sge, length) O(ibv_sge, lkey)
  S(ibv_recv_wr) O(ibv_recv_wr, num_sge)
  S(ibv_wc) O(ibv_wc, wr_id) O(ibv_wc, status) O(ibv_wc, opcode) O(ibv_wc, byte_len)
  O(ibv_wc, imm_data) O(ibv_wc, qp_num) O(ibv_wc, wc_flags) O(ibv_wc, slid)
  O(ibv_wc, dlid_path_bits)
  S(ibv_global_route) O(ibv_global_route, flow_label) O(ibv_global_route, sgid_index)
  S(ibv_ah_attr) O(ibv_ah_attr, dlid) O(ibv_ah_attr, is_global) O(ibv_ah_attr, port_num)
  S(ibv_qp_attr) O(ibv_qp_attr, dest_qp_num) O(ibv_qp_attr, ah_attr) O(ibv_qp_attr, alt_ah_attr)
  O(ibv_qp_attr, max_dest_rd_atomic) O(ibv_qp_attr, timeout) O(ibv_qp_attr, rate_limit)
  S(ibv_qp_init_attr) O(ibv_qp_init_attr, cap) O(ibv_qp_init_attr, qp_type)
  printf("IBV_LINK_LAYER_ETHERNET %d\n", IBV_LINK_LAYER_ETHERNET);
  return 0;
}
"#;

fn c_layout() -> std::collections::HashMap<String, usize> {
    let dir = std::env::temp_dir().join(format!("rrpc-verbs-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, PROBE).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| {
            panic!("running {cc}: {e} (the verbs feature needs a C compiler and libibverbs-dev)")
        });
    assert!(
        out.status.success(),
        "compiling the verbs.h probe failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

#[test]
fn rdma_sys_layouts_match_verbs_h() {
    let c = c_layout();
    let rust: &[(&str, usize)] = &[
        ("ibv_send_wr", size_of::<ibv_send_wr>()),
        ("ibv_send_wr.wr_id", offset_of!(ibv_send_wr, wr_id)),
        ("ibv_send_wr.next", offset_of!(ibv_send_wr, next)),
        ("ibv_send_wr.sg_list", offset_of!(ibv_send_wr, sg_list)),
        ("ibv_send_wr.num_sge", offset_of!(ibv_send_wr, num_sge)),
        ("ibv_send_wr.opcode", offset_of!(ibv_send_wr, opcode)),
        (
            "ibv_send_wr.send_flags",
            offset_of!(ibv_send_wr, send_flags),
        ),
        (
            "ibv_send_wr.imm_data",
            offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union),
        ),
        (
            "ibv_send_wr.wr.rdma.remote_addr",
            offset_of!(ibv_send_wr, wr),
        ),
        (
            "ibv_send_wr.wr.rdma.rkey",
            offset_of!(ibv_send_wr, wr) + offset_of!(rdma_sys::rdma_t, rkey),
        ),
        ("ibv_send_wr.qp_type", offset_of!(ibv_send_wr, qp_type)),
        (
            "ibv_send_wr.bind_mw",
            offset_of!(ibv_send_wr, bind_mw_tso_union),
        ),
        ("ibv_sge", size_of::<ibv_sge>()),
        ("ibv_sge.addr", offset_of!(ibv_sge, addr)),
        ("ibv_sge.length", offset_of!(ibv_sge, length)),
        ("ibv_sge.lkey", offset_of!(ibv_sge, lkey)),
        ("ibv_recv_wr", size_of::<ibv_recv_wr>()),
        ("ibv_recv_wr.num_sge", offset_of!(ibv_recv_wr, num_sge)),
        ("ibv_wc", size_of::<ibv_wc>()),
        ("ibv_wc.wr_id", offset_of!(ibv_wc, wr_id)),
        ("ibv_wc.status", offset_of!(ibv_wc, status)),
        ("ibv_wc.opcode", offset_of!(ibv_wc, opcode)),
        ("ibv_wc.byte_len", offset_of!(ibv_wc, byte_len)),
        (
            "ibv_wc.imm_data",
            offset_of!(ibv_wc, imm_data_invalidated_rkey_union),
        ),
        ("ibv_wc.qp_num", offset_of!(ibv_wc, qp_num)),
        ("ibv_wc.wc_flags", offset_of!(ibv_wc, wc_flags)),
        ("ibv_wc.slid", offset_of!(ibv_wc, slid)),
        ("ibv_wc.dlid_path_bits", offset_of!(ibv_wc, dlid_path_bits)),
        ("ibv_global_route", size_of::<ibv_global_route>()),
        (
            "ibv_global_route.flow_label",
            offset_of!(ibv_global_route, flow_label),
        ),
        (
            "ibv_global_route.sgid_index",
            offset_of!(ibv_global_route, sgid_index),
        ),
        ("ibv_ah_attr", size_of::<ibv_ah_attr>()),
        ("ibv_ah_attr.dlid", offset_of!(ibv_ah_attr, dlid)),
        ("ibv_ah_attr.is_global", offset_of!(ibv_ah_attr, is_global)),
        ("ibv_ah_attr.port_num", offset_of!(ibv_ah_attr, port_num)),
        ("ibv_qp_attr", size_of::<ibv_qp_attr>()),
        (
            "ibv_qp_attr.dest_qp_num",
            offset_of!(ibv_qp_attr, dest_qp_num),
        ),
        ("ibv_qp_attr.ah_attr", offset_of!(ibv_qp_attr, ah_attr)),
        (
            "ibv_qp_attr.alt_ah_attr",
            offset_of!(ibv_qp_attr, alt_ah_attr),
        ),
        (
            "ibv_qp_attr.max_dest_rd_atomic",
            offset_of!(ibv_qp_attr, max_dest_rd_atomic),
        ),
        ("ibv_qp_attr.timeout", offset_of!(ibv_qp_attr, timeout)),
        (
            "ibv_qp_attr.rate_limit",
            offset_of!(ibv_qp_attr, rate_limit),
        ),
        ("ibv_qp_init_attr", size_of::<ibv_qp_init_attr>()),
        ("ibv_qp_init_attr.cap", offset_of!(ibv_qp_init_attr, cap)),
        (
            "ibv_qp_init_attr.qp_type",
            offset_of!(ibv_qp_init_attr, qp_type),
        ),
        (
            "IBV_LINK_LAYER_ETHERNET",
            usize::from(super::caps::LINK_LAYER_ETHERNET),
        ),
    ];
    assert_eq!(c.len(), rust.len(), "probe and table list the same items");
    for (name, r) in rust {
        assert_eq!(
            c.get(*name),
            Some(r),
            "{name}: C says {:?}, Rust {r}",
            c.get(*name)
        );
    }
}
