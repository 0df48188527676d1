// The fanout dashboard: live session status from /v1/events (server-sent, once a second),
// small plots of the last two minutes, and a preview player: MSE fed with the session's
// HLS fMP4 parts, or WebRTC (WHEP), each with how far behind it plays; and the recordings,
// each stretch of recorded time playable and downloadable. Plain JavaScript, no library.
'use strict';

const params = new URLSearchParams(location.search);
let token = params.get('token') || localStorage.getItem('fanout-token') || '';
const q = () => (token ? `?token=${encodeURIComponent(token)}` : '');
// A path name in a URL: its steps as they are (`live/cam1`), each step encoded.
const named = (name) => name.split('/').map(encodeURIComponent).join('/');
const HISTORY = 120;
const cards = new Map(); // session name -> { el, last, hist }
// The first session seen sending plays its preview by itself, once per page.
let autoPreviewed = false;

function $(root, sel) { return root.querySelector(sel); }

async function api(path) {
  const r = await fetch(path, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  if (r.status === 401) { askToken(); throw new Error('unauthorized'); }
  return r.json();
}

function askToken() {
  const form = document.getElementById('login');
  form.hidden = false;
  form.onsubmit = (e) => {
    e.preventDefault();
    token = document.getElementById('token').value;
    localStorage.setItem('fanout-token', token);
    form.hidden = true;
    connect();
  };
}

let source = null;
function connect() {
  if (source) source.close();
  source = new EventSource(`/v1/events${q()}`);
  const dot = document.getElementById('live');
  source.addEventListener('status', (e) => { dot.classList.add('on'); render(JSON.parse(e.data)); });
  source.onerror = () => {
    dot.classList.remove('on');
    // An EventSource does not say why it failed: ask the API whether it is the token.
    api('/v1/engine').catch(() => {});
  };
}

const kbps = (bytes, secs) => (secs > 0 ? (bytes * 8 / 1000 / secs) : 0);
const fmt = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

function render(snap) {
  const e = snap.engine;
  document.getElementById('engine').textContent =
    `${e.workers} workers · ${e.queued_tasks} queued · RTSP ${e.rtsp || 'off'} · ${snap.sessions.length} session${snap.sessions.length === 1 ? '' : 's'}`;
  document.getElementById('empty').hidden = snap.sessions.length > 0;
  const seen = new Set();
  for (const s of snap.sessions) {
    seen.add(s.name);
    let c = cards.get(s.name);
    if (!c) {
      c = newCard(s);
      cards.set(s.name, c);
    }
    update(c, s, snap.time_ms, snap.rtsp_clients.filter((r) => r.session === s.name).length);
  }
  for (const [name, c] of cards) {
    if (!seen.has(name)) { c.el.remove(); cards.delete(name); }
  }
}

function newCard(s) {
  const el = document.getElementById('card').content.firstElementChild.cloneNode(true);
  el.dataset.session = s.name;
  $(el, '.name').textContent = s.name;
  $(el, '.play').onclick = () => togglePreview(el, s.name);
  document.getElementById('sessions').appendChild(el);
  return { el, last: null, hist: { in: [], loss: [] } };
}

function update(c, s, now, rtspClients) {
  const el = c.el;
  $(el, '.path').textContent = s.datapath;
  const st = $(el, '.state');
  // A publish session says who publishes, and over what (RTSP, RTMP or SRT).
  const over = { rtmp: 'RTMP', srt: 'SRT', webrtc: 'WebRTC' }[s.publisher && s.publisher.transport] || 'RTSP';
  const pub = s.publisher && (s.publisher.state === 'publishing' ? `published over ${over}` : 'waiting for a publisher');
  st.textContent = s.upstream ? `upstream ${s.upstream.state}` : (pub || s.source.state);
  st.className = `badge state ${s.upstream ? (s.upstream.state === 'playing' ? 'active' : 'waiting') : s.source.state}`;
  $(el, '.source').textContent = s.source.kind + (s.source.error ? ` — ${s.source.error}` : '') +
    (s.repackaging ? ` · repackaged: ${s.repackaging.from}` : '');
  const lost = (s.upstream ? s.upstream.tracks.reduce((a, t) => a + t.lost, 0) : 0);
  // Out: the session's sinks, and what its repackaging sends (HTTP TS subscribers, HLS).
  const r = s.repackaging || {};
  const out = s.bytes_sent + ((r.ts && r.ts.bytes_sent) || 0) + ((r.hls && r.hls.bytes_served) || 0);
  const cur = { t: now, in: s.source.bytes, out, skipped: s.packets_skipped, lost };
  if (c.last) {
    const dt = (cur.t - c.last.t) / 1000;
    const rin = kbps(cur.in - c.last.in, dt);
    const skips = Math.max(0, cur.skipped - c.last.skipped) / dt;
    const lossNow = Math.max(0, cur.lost - c.last.lost) / dt;
    $(el, '.in').textContent = fmt(rin);
    $(el, '.out').textContent = fmt(kbps(cur.out - c.last.out, dt));
    $(el, '.skips').textContent = fmt(skips);
    push(c.hist.in, rin);
    push(c.hist.loss, skips + lossNow);
    plot($(el, '.plot-in'), c.hist.in, '#58a6ff');
    plot($(el, '.plot-loss'), c.hist.loss, '#f85149');
  }
  c.last = cur;
  $(el, '.sinks').textContent = s.sinks + ((r.ts && r.ts.sinks) || 0);
  $(el, '.hls').textContent = (r.hls && r.hls.players) || 0;
  const srtReaders = (s.srt || []).filter((l) => l.mode === 'read').length;
  $(el, '.rtmp').textContent = `${(r.rtmp && r.rtmp.players) || 0} / ${srtReaders}`;
  $(el, '.webrtc').textContent = (s.webrtc || []).filter((v) => v.role === 'viewer').length;
  $(el, '.how').disabled = !s.webrtc;
  if (!autoPreviewed && s.source.state === 'active' && window.MediaSource) {
    autoPreviewed = true;
    togglePreview(el, s.name);
  }
  $(el, '.rtsp').textContent = rtspClients;
  $(el, '.loss').textContent = lost;
  links(el, s);
  sinks(el, s);
  $(el, '.readers-n').textContent = s.readers ?? '';
  if ($(el, '.readers-box').open) readers(el, s.name);
}

// Who reads the path, on every face, each with a button that ends it (its client is told the
// end its protocol's way). Asked while the list is open.
async function readers(el, name) {
  if (el.dataset.readersBusy) return;
  el.dataset.readersBusy = '1';
  try {
    const list = await api(`/v1/sessions/${named(name)}/readers`);
    const mb = (b) => `${fmt(b / 1e6)} MB`;
    $(el, '.readers-table tbody').innerHTML = list.map((r) =>
      `<tr><td>${esc(r.protocol)}</td><td>${esc(r.addr || '')}</td><td>${esc(r.user || '')}</td>` +
      `<td>${fmt(r.duration_s)} s</td><td>${mb(r.bytes)}</td><td>${r.skips}</td>` +
      `<td><button type="button" class="kick" data-id="${esc(r.id)}" title="end this reader">end</button></td></tr>`).join('');
    for (const b of el.querySelectorAll('.readers-table .kick')) {
      b.onclick = () => fetch(`/v1/sessions/${named(name)}/readers/${encodeURIComponent(b.dataset.id)}`,
        { method: 'DELETE', headers: auth() });
    }
  } catch (e) {
    // (Told by the next update: the token, or the path gone.)
  } finally {
    delete el.dataset.readersBusy;
  }
}

function push(a, v) { a.push(v); if (a.length > HISTORY) a.shift(); }

// A filled line of the history, scaled to its maximum (labelled in the corner).
function plot(canvas, data, color) {
  const g = canvas.getContext('2d');
  const w = canvas.width, h = canvas.height;
  g.clearRect(0, 0, w, h);
  const max = Math.max(1e-9, ...data);
  g.beginPath();
  data.forEach((v, i) => {
    const x = w - (data.length - 1 - i) * (w / (HISTORY - 1));
    const y = h - 2 - (v / max) * (h - 14);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.strokeStyle = color;
  g.lineWidth = 1.5;
  g.stroke();
  g.fillStyle = '#8b98a5';
  g.font = '10px system-ui';
  g.fillText(fmt(max), 3, 10);
}

function links(el, s) {
  const box = $(el, '.links');
  if (box.dataset.done) return;
  box.dataset.done = '1';
  const add = (label, href) => {
    const a = document.createElement('a');
    a.textContent = label;
    a.href = href;
    a.title = href;
    box.appendChild(a);
  };
  add('stream (HTTP)', `/v1/sessions/${named(s.name)}/stream${q()}`);
  add('HLS', `/v1/sessions/${named(s.name)}/hls/index.m3u8${q()}`);
  if (s.rtsp_url) add('RTSP', s.rtsp_url);
  add('status (JSON)', `/v1/sessions/${named(s.name)}`);
}

function sinks(el, s) {
  const body = $(el, '.sinks-table tbody');
  const rows = (s.sinks_list || []).map((k) => {
    const to = k.udp || k.tcp || k.http || (k.local && 'in-process: ' + k.local) || k.peer || k.to || '';
    const layers = k.layers ? JSON.stringify(k.layers) : '';
    return `<tr><td>${k.id}</td><td>${esc(to)}</td><td>${esc(k.path || '')}</td><td>${esc(k.state || '')}</td>` +
      `<td>${k.packets_sent}</td><td>${k.lag ?? ''}</td><td>${k.packets_skipped ?? ''}</td><td>${esc(layers)}</td></tr>`;
  });
  if ((s.sinks_list || []).length < s.sinks) rows.push(`<tr><td colspan="8">… and ${s.sinks - s.sinks_list.length} more</td></tr>`);
  body.innerHTML = rows.join('');
  const tracks = (s.rtsp_tracks || []).map((t) => `${t.session}: ${t.sinks} sinks, ${t.source_packets} packets in`);
  $(el, '.tracks').textContent = tracks.join(' · ');
}

function esc(x) {
  return String(x).replace(/[&<>"]/g, (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[ch]));
}

// --- the preview: HLS fMP4 parts appended to a MediaSource -------------------------------

async function togglePreview(el, name) {
  const box = $(el, '.player');
  const video = $(box, 'video');
  if (!box.hidden) {
    box.hidden = true;
    stopPreview(video);
    return;
  }
  box.hidden = false;
  // Each preview has its generation: one stopped (or replaced) says and does no more.
  const gen = (video.gen = (video.gen || 0) + 1);
  const live = () => video.gen === gen && video.isConnected;
  $(box, '.why').textContent = 'starting…';
  $(box, '.latency').textContent = '';
  const say = (m) => { if (live()) $(box, '.why').textContent = m; };
  const latency = (m) => { if (live()) $(box, '.latency').textContent = m; };
  try {
    if ($(el, '.how').value === 'webrtc') await playWebRtc(video, name, say, latency);
    else await play(video, name, say, latency, live);
  } catch (e) {
    say(`no preview: ${e.message}`);
  }
}

function stopPreview(video) {
  video.gen = (video.gen || 0) + 1;
  if (video.pc) {
    // The resource first: the peer connection closed first would end it on the relay's
    // side before the DELETE came.
    const pc = video.pc;
    const gone = video.whep ? fetch(video.whep, { method: 'DELETE', headers: auth() }) : Promise.resolve();
    gone.catch(() => {}).finally(() => pc.close());
    video.pc = null;
    video.whep = null;
  }
  clearInterval(video.timer);
  video.srcObject = null;
  video.removeAttribute('src');
  video.load();
}

const auth = () => (token ? { Authorization: `Bearer ${token}` } : {});

// --- the preview over WebRTC: a WHEP offer, the answer, the picture ---------------------

async function playWebRtc(video, name, say, latency) {
  const pc = new RTCPeerConnection();
  video.pc = pc;
  pc.addTransceiver('video', { direction: 'recvonly' });
  pc.addTransceiver('audio', { direction: 'recvonly' });
  pc.ontrack = (e) => { if (e.track.kind === 'video') video.srcObject = new MediaStream([e.track]); };
  await pc.setLocalDescription(await pc.createOffer());
  const r = await fetch(`/${named(name)}/whep`, {
    method: 'POST', headers: { 'Content-Type': 'application/sdp', ...auth() }, body: pc.localDescription.sdp,
  });
  const body = await r.text();
  if (r.status !== 201) throw new Error(`${r.status} ${body}`);
  video.whep = r.headers.get('Location');
  await pc.setRemoteDescription({ type: 'answer', sdp: body });
  video.play().catch(() => {});
  say('');
  // How far behind: the relay's newest picture sent (its status) against the newest this
  // browser received, plus what its jitter buffer and decoder took per frame.
  const id = video.whep.split('/').pop();
  video.timer = setInterval(async () => {
    if (!video.pc) return;
    const st = await api(`/v1/sessions/${named(name)}`).catch(() => null);
    const me = st && (st.webrtc || []).find((v) => v.id === id);
    const recv = pc.getReceivers().find((x) => x.track.kind === 'video');
    const src = recv && recv.getSynchronizationSources()[0];
    let inbound = null;
    (await pc.getStats()).forEach((s) => { if (s.type === 'inbound-rtp' && s.kind === 'video') inbound = s; });
    if (!me || !me.last_picture || !src || !inbound || !inbound.framesDecoded) return;
    const ahead = (((src.rtpTimestamp - me.last_picture.rtp) | 0)) / 90;
    const arrival = src.timestamp - (me.last_picture.unix_ms + ahead);
    const browser = 1000 * inbound.totalProcessingDelay / inbound.framesDecoded;
    latency(`WebRTC: decoded ${Math.max(0, arrival + browser).toFixed(0)} ms after the relay sent it`);
  }, 1000);
}

async function get(url, kind) {
  const r = await fetch(url);
  if (!r.ok) {
    let why = `${r.status}`;
    try { why = (await r.json()).error || why; } catch (_) { /* not JSON */ }
    throw new Error(why);
  }
  return kind === 'text' ? r.text() : r.arrayBuffer();
}

// The Low-Latency parts a playlist lists, as [segment, part], those a decoder can start at.
const startsOf = (playlist) => [...playlist.matchAll(/#EXT-X-PART:[^\n]*URI="(\d+)\.(\d+)\.m4s[^"]*",INDEPENDENT=YES/g)]
  .map((m) => [parseInt(m[1], 10), parseInt(m[2], 10)]);
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

async function play(video, name, say, latency, live) {
  const base = `/v1/sessions/${named(name)}/hls/`;
  // The first playlist starts the repackaging and waits for a segment. It names this
  // player in the media playlist's URL, which it reloads.
  const variant = (await get(base + 'index.m3u8' + q(), 'text')).split('\n').find((l) => l && !l.startsWith('#'));
  if (!variant || !variant.includes('?')) throw new Error('the playlist names no media playlist');
  const playlist = await get(base + variant, 'text');
  const st = await api(`/v1/sessions/${named(name)}`);
  const codecs = st.repackaging && st.repackaging.hls && st.repackaging.hls.codecs;
  const type = `video/mp4; codecs="${codecs}"`;
  if (!codecs || !window.MediaSource || !MediaSource.isTypeSupported(type)) throw new Error(`this browser cannot play ${codecs}`);
  const ms = new MediaSource();
  video.src = URL.createObjectURL(ms);
  await new Promise((ok) => ms.addEventListener('sourceopen', ok, { once: true }));
  const sb = ms.addSourceBuffer(type);
  const append = (buf) => new Promise((ok, fail) => {
    sb.addEventListener('updateend', ok, { once: true });
    sb.addEventListener('error', fail, { once: true });
    sb.appendBuffer(buf);
  });
  await append(await get(base + 'init.mp4' + q()));
  // From the newest part a decoder can start at, part after part, a part behind live. A
  // blocking playlist reload for the part after this one returns once it exists or its
  // segment ended without it (then the next segment's first part comes).
  const newest = (text) => { const s = startsOf(text); return s.length ? s[s.length - 1] : null; };
  let at = newest(playlist);
  if (!at) throw new Error('the playlist lists no parts');
  let started = false;
  while (live()) {
    let data;
    try {
      data = await get(`${base}${at[0]}.${at[1]}.m4s${q()}`);
    } catch (e) {
      // Gone (the preview fell behind) or not coming: start again from the newest.
      await sleep(300);
      at = newest(await get(base + variant, 'text')) || at;
      continue;
    }
    if (!live()) return;
    await append(data);
    const [n, k] = at;
    const text = await get(`${base}${variant}&_HLS_msn=${n}&_HLS_part=${k + 1}`, 'text');
    at = text.includes(`"${n}.${k + 1}.m4s`) ? [n, k + 1] : [n + 1, 0];
    if (!started && sb.buffered.length) {
      video.currentTime = sb.buffered.start(0);
      started = true;
      video.play().catch(() => {});
      say('');
    }
    if (started && sb.buffered.length) {
      const behind = sb.buffered.end(sb.buffered.length - 1) - video.currentTime;
      latency(`HLS: ${behind.toFixed(1)} s behind the newest part it has`);
    }
    // Keep half a minute behind the playhead.
    if (sb.buffered.length && video.currentTime - sb.buffered.start(0) > 40) {
      sb.remove(sb.buffered.start(0), video.currentTime - 30);
      await new Promise((ok) => sb.addEventListener('updateend', ok, { once: true }));
    }
  }
}

// --- recordings: each path's stretches of recorded time, played as one fMP4 download -----

const duration = (s) => (s >= 3600 ? `${(s / 3600).toFixed(1)} h` : s >= 60 ? `${(s / 60).toFixed(1)} min` : `${s.toFixed(1)} s`);

async function recordings() {
  const box = document.getElementById('recordings');
  const list = await api('/v1/recordings').catch(() => null);
  if (!list) return;
  box.hidden = list.paths.length === 0;
  const rows = [];
  for (const p of list.paths) {
    const one = await api(`/v1/recordings/${named(p.name)}`).catch(() => null);
    if (!one) continue;
    for (const s of one.spans) rows.push({ name: p.name, files: one.files.length, ...s });
  }
  const body = $(box, 'tbody');
  body.innerHTML = '';
  for (const r of rows) {
    const tr = document.createElement('tr');
    const range = `start=${encodeURIComponent(r.start)}&duration=${r.duration_s.toFixed(3)}`;
    const url = `/v1/recordings/${encodeURIComponent(r.name)}/get?${range}${token ? `&token=${encodeURIComponent(token)}` : ''}`;
    tr.innerHTML = `<td>${esc(r.name)}</td><td>${esc(r.start.replace('T', ' ').replace(/\.\d+Z$/, ''))}</td>`
      + `<td>${duration(r.duration_s)}</td><td>${r.files}</td>`
      + `<td><button type="button" class="rec-play">▶ Play</button> <a class="rec-get" href="${esc(url)}" download>download</a></td>`;
    $(tr, '.rec-play').onclick = () => {
      const player = $(box, '.player');
      const video = $(player, 'video');
      player.hidden = false;
      $(player, '.why').textContent = `${r.name} from ${r.start}`;
      video.src = url;
      video.play().catch(() => {});
    };
    body.appendChild(tr);
  }
}

document.getElementById('rec-refresh').onclick = () => recordings();
setInterval(recordings, 15000);
connect();
recordings();
