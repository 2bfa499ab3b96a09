//! smoke
use aya::{programs::SchedClassifier, EbpfLoader};
use dataplane_user::{frames, testrun};

#[test]
fn loads() {
    let obj = dataplane_user::object::flowmon_object().unwrap();
    let mut ebpf = EbpfLoader::new().load(obj).unwrap();
    for name in ["flowmon", "noop"] {
        let p: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
        p.load().unwrap();
    }
    let p: &SchedClassifier = ebpf.program("flowmon").unwrap().try_into().unwrap();
    let f = frames::rocev2_4([10,0,0,1],[10,0,0,2], 1000, 0x0a, 5, 7, &[], &[0u8; 64]);
    let r = testrun::run(p, &f, Some(&testrun::SkbContext::ingress()), 1).unwrap();
    println!("{r:?}");
    for (n, m) in ebpf.maps() { println!("map {n}"); let _ = m; }
}
