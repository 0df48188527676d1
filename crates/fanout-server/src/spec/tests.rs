use super::*;

fn parse(j: &str) -> Result<SessionSpec, String> {
    let s: SessionSpec = serde_json::from_str(j).map_err(|e| e.to_string())?;
    s.validate().map_err(|e| e.0)?;
    Ok(s)
}

#[test]
fn accepts_the_documented_example() {
    let s = parse(r#"{"name":"tv1","source":{"udp":"127.0.0.1:5004"},"priority":3,"datapath":"shared"}"#).unwrap();
    assert_eq!(s.priority, 3);
    assert_eq!(s.datapath, Some(DataPath::Shared));
}

#[test]
fn source_fields_list_is_complete() {
    let e = serde_json::from_str::<SourceFields>(r#"{"nope":1}"#).unwrap_err().to_string();
    for key in SOURCE_FIELDS {
        assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
    }
    assert_eq!(e.matches('`').count() / 2 - 1, SOURCE_FIELDS.len(), "{e}");
}

#[test]
fn rejects_with_reasons() {
    let cases = [
        (r#"{"name":"a","source":{"udp":"127.0.0.1:5004"},"colour":1}"#, "unknown field `colour`"),
        (r#"{"name":"a","source":{"udp":"nowhere"}}"#, "invalid socket address"),
        (r#"{"name":"a b","source":{"demo":true}}"#, "must be 1-128"),
        (r#"{"name":"a","source":{"demo":true},"priority":9}"#, "out of range"),
        (r#"{"name":"a","source":{}}"#, "exactly one"),
        (r#"{"name":"a","source":{"whep":"http://h/a\nFAKE/whep"}}"#, "control character"),
        (r#"{"name":"a","source":{"hls":"rtmp://h/a/index.m3u8"}}"#, "not an http:// or https:// URL"),
        (r#"{"name":"a","source":{"hls":"http:///index.m3u8"}}"#, "names no host"),
        (r#"{"name":"a","source":{"hls":"http://h/i.m3u8","tls_verify":false}}"#, "apply to an https://"),
        (r#"{"name":"a","source":{"demo":true},"datapath":"warp"}"#, "unknown variant `warp`"),
        (
            r#"{"name":"a","source":{"demo":true},"record":{"format":"mkv"}}"#,
            r#"record.format "mkv": "fmp4" or "mpegts""#,
        ),
        (r#"{"name":"a","source":{"demo":true},"ring":1}"#, "ring 1"),
        (r#"{"name":"a","source":{"demo":true},"sinks":[{"udp":"127.0.0.1:0"}]}"#, "port 0"),
        (r#"{"name":"a","source":{"udp":"127.0.0.1:5","interface":"127.0.0.1"}}"#, "multicast"),
        (r#"{"name":".","source":{"demo":true}}"#, "cannot be addressed"),
        (r#"{"name":"..","source":{"demo":true}}"#, "cannot be addressed"),
        (r#"{"name":"live/..","source":{"demo":true}}"#, "cannot be addressed"),
        (r#"{"name":"live/","source":{"demo":true}}"#, "empty step"),
        (r#"{"name":"a","source":{"demo":true},"sinks":[{"udp":"255.255.255.255:5000"}]}"#, "broadcast"),
    ];
    for (j, want) in cases {
        let e = parse(j).unwrap_err();
        assert!(e.contains(want), "{j}: {e}");
    }
}

use proptest::prelude::*;

fn any_addr() -> impl Strategy<Value = SocketAddr> + Clone {
    (any::<[u8; 4]>(), 1u16..).prop_map(|(ip, port)| SocketAddr::from((ip, port)))
}

/// Every kind, with settings it may have.
fn any_source() -> impl Strategy<Value = SourceSpec> {
    let udp = (any_addr(), any::<[u8; 4]>())
        .prop_map(|(addr, i)| SourceSpec::Udp { addr, interface: addr.ip().is_multicast().then(|| Ipv4Addr::from(i)) });
    let file = ("[a-z/]{1,12}", proptest::option::of(any::<bool>()))
        .prop_map(|(p, looped)| SourceSpec::File { path: p.into(), looped });
    let rtsp = (
        any::<bool>(),
        "[a-z]{1,8}",
        proptest::option::of(prop_oneof![
            Just(RtspTransport::Auto),
            Just(RtspTransport::Udp),
            Just(RtspTransport::Tcp)
        ]),
        proptest::option::of(any::<bool>()),
        // Settings as people write them (tenths of seconds): serde_json's float reading
        // may differ from the written one in the last bit of other values.
        proptest::option::of((0..864_000u32).prop_map(|d| f64::from(d) / 10.0)),
        proptest::option::of((1..36_000u32).prop_map(|d| f64::from(d) / 10.0)),
    )
        .prop_map(|(tls, path, transport, on_demand, linger_s, timeout_s)| {
            SourceSpec::Rtsp(RtspSource {
                url: format!("{}://cam.example:8554/{path}", if tls { "rtsps" } else { "rtsp" }),
                transport,
                on_demand,
                linger_s,
                timeout_s,
                tls_verify: tls.then_some(true),
                ..Default::default()
            })
        });
    let rtmp = (
        any::<bool>(),
        "[a-z]{1,8}",
        proptest::option::of(any::<bool>()),
        proptest::option::of((0..864_000u32).prop_map(|d| f64::from(d) / 10.0)),
    )
        .prop_map(|(tls, key, on_demand, linger_s)| {
            SourceSpec::Rtmp(PullSource {
                url: format!("{}://cam.example/live/{key}", if tls { "rtmps" } else { "rtmp" }),
                on_demand,
                linger_s,
                tls_verify: tls.then_some(true),
                ..Default::default()
            })
        });
    let whep = (any::<bool>(), "[a-z]{1,8}", proptest::option::of(any::<bool>())).prop_map(|(tls, path, on_demand)| {
        SourceSpec::Whep(PullSource {
            url: format!("{}://cam.example:8889/{path}/whep", if tls { "https" } else { "http" }),
            on_demand,
            tls_verify: tls.then_some(true),
            ..Default::default()
        })
    });
    let hls = (any::<bool>(), "[a-z]{1,8}", proptest::option::of(any::<bool>())).prop_map(|(tls, path, on_demand)| {
        SourceSpec::Hls(PullSource {
            url: format!("{}://cdn.example/{path}/index.m3u8", if tls { "https" } else { "http" }),
            on_demand,
            tls_verify: tls.then_some(true),
            ..Default::default()
        })
    });
    let srt = ("[a-z]{1,8}", proptest::option::of(any::<bool>())).prop_map(|(id, on_demand)| {
        SourceSpec::Srt(PullSource {
            url: format!("srt://cam.example:9000?streamid=read:{id}"),
            on_demand,
            ..Default::default()
        })
    });
    prop_oneof![
        udp,
        rtmp,
        whep,
        hls,
        srt,
        any_addr().prop_map(SourceSpec::TcpListen),
        any_addr().prop_map(SourceSpec::TcpConnect),
        Just(SourceSpec::Demo),
        file,
        any::<bool>().prop_map(|takeover| SourceSpec::Publish { takeover, fallback: None }),
        rtsp,
    ]
}

/// Any object of source keys, sensible or not.
fn any_fields() -> impl Strategy<Value = SourceFields> {
    let addr = proptest::option::of(any_addr());
    (
        (addr.clone(), proptest::option::of(any::<[u8; 4]>()), addr.clone(), addr),
        (proptest::option::of(any::<bool>()), proptest::option::of("[a-z]{1,4}"), proptest::option::of(any::<bool>())),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of("(rtsps?://h/p|nope|rtsp://)"),
            proptest::option::of(any::<bool>()),
        ),
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(-10.0..100_000.0f64),
            proptest::option::of(any::<bool>()),
        ),
    )
        .prop_map(
            |(
                (udp, interface, tcp_listen, tcp_connect),
                (demo, file, looped),
                (publish, rtsp, takeover),
                (on_demand, linger_s, tls_verify),
            )| {
                SourceFields {
                    udp,
                    interface: interface.map(Ipv4Addr::from),
                    tcp_listen,
                    tcp_connect,
                    demo,
                    file: file.map(Into::into),
                    looped,
                    publish,
                    takeover,
                    rtsp,
                    on_demand,
                    linger_s,
                    tls_verify,
                    ..Default::default()
                }
            },
        )
}

proptest! {
    /// What the API and the state file write is read back as the same source.
    #[test]
    fn every_source_reads_back_as_written(s in any_source()) {
        let json = serde_json::to_string(&s).unwrap();
        let back: SourceSpec = serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?;
        prop_assert_eq!(back, s);
    }

    /// Any combination of keys is read as exactly one kind, or refused with a reason
    /// that names a key; never a panic.
    #[test]
    fn any_keys_make_one_kind_or_a_reason(f in any_fields()) {
        match SourceSpec::try_from(f.clone()) {
            Ok(s) => prop_assert_eq!(SourceSpec::try_from(SourceFields::from(s.clone())), Ok(s)),
            Err(why) => prop_assert!(why.0.starts_with("source"), "{why} for {f:?}"),
        }
    }
}

#[test]
fn forward_takes_urls_and_tables_and_refuses_what_it_cannot_push() {
    let s = parse(
        r#"{"name":"a","source":{"demo":true},"forward":["rtmp://h/live/k",
            {"url":"rtmps://h:8443/app/k?user=u&pass=p","tls_verify":false}]}"#,
    )
    .unwrap();
    assert_eq!(s.forward[0], ForwardSpec { url: "rtmp://h/live/k".into(), ..Default::default() });
    assert_eq!(s.forward[1].tls_verify, Some(false));
    s.validate().unwrap();
    let ForwardTo::Rtmp(url, verify) = s.forward[1].target().unwrap() else { panic!("an RTMP target") };
    assert_eq!((url.app.as_str(), url.port, verify), ("app", 8443, crate::tls::Verify::Off));
    let srt = ForwardSpec { url: "srt://h:9000?streamid=publish:cam&latency=200".into(), ..Default::default() };
    let ForwardTo::Srt(url) = srt.target().unwrap() else { panic!("an SRT target") };
    assert_eq!((url.port, url.latency_ms, url.streamid.as_deref()), (9000, Some(200), Some("publish:cam")));
    let rtsp = ForwardSpec { url: "rtsps://u:p@h/live/cam".into(), tls_verify: Some(false), ..Default::default() };
    let ForwardTo::Rtsp(url, verify) = rtsp.target().unwrap() else { panic!("an RTSP target") };
    assert_eq!((url.request_url(), verify), ("rtsps://h:322/live/cam".to_string(), crate::tls::Verify::Off));
    let whip = ForwardSpec { url: "https://u:p@h/cam/whip".into(), ..Default::default() };
    let ForwardTo::Whip(url, verify) = whip.target().unwrap() else { panic!("a WHIP target") };
    assert_eq!((url.shown(), verify), ("https://h:443/cam/whip".to_string(), crate::tls::Verify::PublicRoots));
    // What the API shows again parses to the same.
    let again: SessionSpec = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
    assert_eq!(again, s);
    for (forward, says) in [
        (r#""whip://h/x""#, "not \"whip\""),
        (r#""rtmp://h/live/k\nFAKE""#, "control character"),
        (r#""http://h:0/cam/whip""#, "bad port"),
        (r#""rtsp://h:x/cam""#, "bad port"),
        (r#""srt://h""#, "the port is missing"),
        (r#""srt://h:9000?streamid=read:cam""#, "a forward publishes"),
        (r#"{"url":"srt://h:9000","tls_verify":false}"#, "tls_* are for rtmps://"),
        (r#""rtmp://h""#, "names no application"),
        (r#"{"url":"rtmps://h/a/b","tls_ca":"/c.pem","tls_verify":false}"#, "at most one"),
        (r#"{"url":"rtmp://h/a/b","colour":1}"#, "did not match any variant"),
    ] {
        let json = format!(r#"{{"name":"a","source":{{"demo":true}},"forward":[{forward}]}}"#);
        let e = parse(&json);
        assert!(e.as_ref().is_err_and(|e| e.contains(says)), "{forward}: {e:?}");
    }
}

/// An HLS source's URL in logs and the status keeps no credentials and no token.
#[test]
fn an_hls_url_is_shown_without_its_secrets() {
    assert_eq!(
        hls_shown("https://u:p@cdn.example:8443/live/cam/index.m3u8?jwt=secret"),
        "https://cdn.example:8443/live/cam/index.m3u8"
    );
    assert_eq!(hls_shown("http://h"), "http://h/");
    assert_eq!(hls_url("https://u:p@h/x.m3u8"), Ok(true));
}
