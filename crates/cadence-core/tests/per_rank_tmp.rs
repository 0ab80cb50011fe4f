use cadence_core::schedule::{self, CollArgs, Topology};
use cadence_core::CollKind;
use std::time::Instant;
#[test]
#[ignore]
fn per_rank() {
    let n = 8192;
    let hosts: Vec<usize> = (0..n).map(|r| r / 8).collect();
    let topo = Topology::from_hosts(&hosts);
    for (kind, counts) in [
        (CollKind::AllReduce, vec![8 << 20]),
        (CollKind::AllGather, vec![1 << 10; n]),
        (CollKind::ReduceScatter, vec![1 << 10; n]),
        (CollKind::Broadcast, vec![256 << 10]),
        (CollKind::Reduce, vec![256 << 10]),
    ] {
        let args = CollArgs {
            kind,
            root: 0,
            counts,
        };
        for &a in schedule::algos_for(kind) {
            if !schedule::applicable_on(&args, &topo, a) {
                println!("{kind:?} {a:?} n/a");
                continue;
            }
            let t = Instant::now();
            let mut ph = 0;
            for r in [0, 7, 4000] {
                ph = schedule::build_on(&args, r, &topo, a).unwrap().phases.len();
            }
            println!(
                "{kind:?} {a:?}: {:.3} ms/rank, {ph} phases",
                t.elapsed().as_secs_f64() * 1e3 / 3.0
            );
        }
    }
}
