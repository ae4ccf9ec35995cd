#!/usr/bin/env bash
# Starts a throwaway control plane on loopback (etcd, kube-apiserver, kube-controller-manager), runs a command
# against it, and stops everything it started when the command ends, fails, or the script is interrupted.
#
# Usage: hack/start-kube.sh [--] COMMAND [ARG...]
#
# The command sees:
#   KUBECONFIG            admin kubeconfig (static system:masters token, CA-verified TLS)
#   DYNK8S_E2E_KUBECONFIG same file (the e2e tests refuse to run against an ambient KUBECONFIG)
#   DYNK8S_E2E_SERVER     https://127.0.0.1:<port>
#   DYNK8S_E2E_CA         the cluster CA certificate (PEM), as kubeadm's cluster-info carries it
#   DYNK8S_E2E_DIR        the run dir (logs/ has each component's log)
# Tools come from hack/tools.sh's cache (run it first) ahead of anything else on PATH.
#
# There is no kubelet or scheduler: pods stay Pending (the burst test runs a kube-scheduler of its own while it
# runs). The controller manager runs so that namespaces finish deleting, service accounts appear, and bootstrap
# tokens get signed into cluster-info and cleaned up on expiry.
# Authorization, admission and certificate signing are set as kubeadm sets them, so that a test can join a real
# kubelet: Node and RBAC authorization, NodeRestriction, bootstrap-token authentication, and the controller manager
# signing (and, with the RBAC kubeadm creates, approving) kubelet client certificates with the cluster CA.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[[ ${1:-} == -- ]] && shift
if (($# == 0)); then
	echo "usage: $0 [--] COMMAND [ARG...]" >&2
	exit 2
fi

PATH="$("$here/tools.sh" --print-path):$PATH"
export PATH
for tool in etcd kube-apiserver kube-controller-manager kubectl openssl curl python3; do
	if ! command -v "$tool" >/dev/null; then
		echo "start-kube.sh: $tool not found; run hack/tools.sh first" >&2
		exit 1
	fi
done

log() {
	printf '[start-kube %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

run=$(mktemp -d "${TMPDIR:-/tmp}/dynk8s-kube.XXXXXX")
pids=()

stop_all() {
	local rc=$? i pid f
	trap - EXIT INT TERM
	# Logs first, while they still show the failure rather than the shutdown.
	if ((rc != 0)); then
		for f in "$run"/logs/*.log; do
			[[ -f $f ]] || continue
			log "last lines of $(basename "$f"):"
			tail -n 15 "$f" >&2 || true
		done
	fi
	# Reverse start order, each gone before the next, so nothing outlives what it depends on.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		pid=${pids[i]}
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ -n ${DYNK8S_KEEP_KUBE_DIR:-} ]]; then
		log "kept $run"
	else
		rm -rf "$run"
	fi
	exit "$rc"
}
trap stop_all EXIT
# The command runs in the background so that `wait` returns on a signal (a foreground child would delay the trap
# until it exited); the trap passes the signal on before tearing the control plane down.
cmd_pid=
on_signal() {
	if [[ -n $cmd_pid ]]; then
		kill -TERM "$cmd_pid" 2>/dev/null || true
		wait "$cmd_pid" 2>/dev/null || true
	fi
	exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# free_port: a port free now, below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
# default), so that no outgoing connection is given it between this probe and the server's bind: a port the kernel
# picked (bind to 0) comes from that range, and etcd once found one taken by then ("bind: address already in use").
free_port() {
	python3 -c '
import random, socket, sys
for _ in range(500):
    port = random.randint(20000, 32000)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    sys.exit(0)
sys.exit("no free port in 20000-32000")
'
}

# wait_for NAME SECONDS CMD...: polls CMD; fails early if the process just started has died.
wait_for() {
	local name=$1 secs=$2 pid=${pids[-1]}
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			log "$name exited during start-up"
			return 1
		fi
		if ((SECONDS >= deadline)); then
			log "$name not ready after $secs s"
			return 1
		fi
		sleep 0.3
	done
}

mkdir -p "$run"/{pki,logs,etcd}
chmod 700 "$run"
pki=$run/pki
start=$SECONDS

# PKI: one CA that signs the serving certificate, so clients verify TLS as a real node would (kubeadm's discovery
# pins this CA's public key), plus the service-account signing key pair the apiserver requires. The kubernetes
# Service's address (the first of --service-cluster-ip-range) is a name of the certificate too, as kubeadm makes it:
# a pod on a box node reaches the API server there, as in-cluster clients do. So is the on-prem address the burst's
# nodes reach it at through the tunnel, where the test's on-prem namespace forwards to loopback: the dev stack's
# kubernetes.apiServerEndpoint host (Pulumi.dev.yaml), or DYNK8S_E2E_ONPREM_API_IP.
onprem_api_ip=${DYNK8S_E2E_ONPREM_API_IP:-192.168.10.10}
openssl_q() { openssl "$@" 2>/dev/null; }
openssl_q req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=dynk8s-e2e-ca" \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
	-keyout "$pki/ca.key" -out "$pki/ca.crt"
openssl_q req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr"
openssl_q x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
	-extfile <(printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:$onprem_api_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc" \
		"extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature,keyEncipherment") \
	-out "$pki/apiserver.crt"
openssl_q genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
openssl_q pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

admin_token=$(openssl rand -hex 32)
# token-auth-file is CSV: token,user,uid,"group[,group]".
printf '%s,dynk8s-e2e-admin,dynk8s-e2e-admin,"system:masters"\n' "$admin_token" >"$pki/tokens.csv"

etcd_client=$(free_port)
etcd_peer=$(free_port)
api_port=$(free_port)
kcm_port=$(free_port)
server=https://127.0.0.1:$api_port

kubeconfig=$run/admin.kubeconfig
kubectl config set-cluster e2e --kubeconfig="$kubeconfig" --server="$server" \
	--certificate-authority="$pki/ca.crt" --embed-certs=true >/dev/null
kubectl config set-credentials admin --kubeconfig="$kubeconfig" --token="$admin_token" >/dev/null
kubectl config set-context e2e --kubeconfig="$kubeconfig" --cluster=e2e --user=admin >/dev/null
kubectl config use-context e2e --kubeconfig="$kubeconfig" >/dev/null

log "etcd on 127.0.0.1:$etcd_client"
etcd --name e2e --data-dir "$run/etcd" \
	--listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
	--listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
	--initial-cluster "e2e=http://127.0.0.1:$etcd_peer" --listen-metrics-urls "" \
	>"$run/logs/etcd.log" 2>&1 &
pids+=($!)
wait_for etcd 30 curl -fsS "http://127.0.0.1:$etcd_client/health"

log "kube-apiserver on $server"
# --endpoint-reconciler-type=none: the apiserver would otherwise try to publish its loopback address as the
# kubernetes Service endpoint, which is invalid, every 10 s. ServiceAccount admission is off because no token
# controller mints legacy tokens for pods that will never run anyway.
kube-apiserver \
	--etcd-servers "http://127.0.0.1:$etcd_client" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
	--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
	--client-ca-file "$pki/ca.crt" \
	--token-auth-file "$pki/tokens.csv" \
	--enable-bootstrap-token-auth \
	--anonymous-auth=true \
	--authorization-mode Node,RBAC \
	--enable-admission-plugins NodeRestriction \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
	--service-cluster-ip-range 10.96.0.0/12 \
	--endpoint-reconciler-type none \
	--disable-admission-plugins ServiceAccount \
	--allow-privileged=true \
	--profiling=false \
	>"$run/logs/kube-apiserver.log" 2>&1 &
pids+=($!)
wait_for kube-apiserver 90 kubectl --kubeconfig "$kubeconfig" get --raw /readyz

log "kube-controller-manager"
# bootstrapsigner and tokencleaner are off by default (kubeadm turns them on); the join discovery needs the first.
kube-controller-manager \
	--kubeconfig "$kubeconfig" \
	--authentication-kubeconfig "$kubeconfig" --authorization-kubeconfig "$kubeconfig" \
	--authentication-skip-lookup \
	--bind-address 127.0.0.1 --secure-port "$kcm_port" \
	--controllers '*,bootstrapsigner,tokencleaner' \
	--leader-elect=false \
	--use-service-account-credentials=false \
	--service-account-private-key-file "$pki/sa.key" \
	--root-ca-file "$pki/ca.crt" \
	--cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
	--profiling=false \
	>"$run/logs/kube-controller-manager.log" 2>&1 &
pids+=($!)
wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$kcm_port/healthz"
# The default service account is the controller manager's first visible work.
wait_for kube-controller-manager 60 kubectl --kubeconfig "$kubeconfig" -n default get serviceaccount default

log "control plane ready in $((SECONDS - start)) s"

export KUBECONFIG=$kubeconfig DYNK8S_E2E_KUBECONFIG=$kubeconfig DYNK8S_E2E_SERVER=$server \
	DYNK8S_E2E_CA=$pki/ca.crt DYNK8S_E2E_DIR=$run
# Not exec: the EXIT trap must run after the command to stop the control plane.
"$@" &
cmd_pid=$!
wait "$cmd_pid"
