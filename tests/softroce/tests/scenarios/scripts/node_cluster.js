// Node.js's cluster module as PM2 runs it: the primary accepts each connection and sends it
// to a worker (SCHED_RR, Linux's default); each worker answers with what its socket says of
// the connection (and, for /reset, how the client's reset reached it). Exits after N requests.
//   node node_cluster.js ADDR PORT N
const cluster = require('cluster');
const http = require('http');
const [addr, port, n] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
cluster.schedulingPolicy = cluster.SCHED_RR;
if (cluster.isPrimary) {
  let served = 0;
  for (let i = 0; i < 2; i++) cluster.fork();
  cluster.on('message', () => {
    if (++served >= n) {
      for (const id in cluster.workers) cluster.workers[id].kill();
    }
  });
} else {
  http.createServer((req, res) => {
    const s = req.socket;
    if (req.url === '/reset') {
      // Never answered: the client resets the connection; says how the worker learnt it.
      let error = 'none';
      s.on('error', (e) => { error = e.code; });
      s.on('close', () => { console.log(`reset ${error}`); process.send('served'); });
      return;
    }
    s.setNoDelay(true);
    const line = `${process.pid} ${s.remoteFamily} ${s.remoteAddress}:${s.remotePort} ` +
      `${s.localAddress}:${s.localPort}`;
    res.setHeader('Connection', 'close');
    res.end(line + '\n');
    process.send('served');
  }).listen(port, addr);
}
