import json,glob,os,sys
for f in sorted(glob.glob(sys.argv[1]+'/*.json'),key=os.path.getmtime):
    try: d=json.load(open(f))
    except Exception: continue
    for srv,s in (d.get('servers') or {}).items():
        for sc,r in (s.get('scenarios') or {}).items():
            g=lambda k,q: (r.get(k) or {}).get(q)
            print(f"{os.path.basename(f)} {srv} {sc}: tok/s {r.get('tok_s')} failed {r.get('failed')} TTFT p50/p99 {g('ttft_ms','p50')}/{g('ttft_ms','p99')} ITL {g('itl_ms','p50')}/{g('itl_ms','p99')} 2nd {g('itl_first_ms','p50')}/{g('itl_first_ms','p99')} later {g('itl_later_ms','p50')}/{g('itl_later_ms','p99')}")
            st=r.get('server_stats') or {}
            it=(st.get('iteration_times') or {}).get('decode') or {}
            sl=it.get('slow') or {}
            if it: print(f"   decode n {it.get('n')} p50 {it.get('p50_ms')} p99 {it.get('p99_ms')} slow {sl.get('n')} over {sl.get('over_ms')} ev {sl.get('events')} all {sl.get('events_all')} ph {sl.get('phases_mean_ms')}")
            if st.get('prefill_lane'): print("   lane", st['prefill_lane'])
