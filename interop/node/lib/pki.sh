# shellcheck shell=bash
# Sourced by node.sh: the node's PKI and kubeconfigs in kubeadm's layout, under $ETC_K8S (bind
# mounted onto /etc/kubernetes inside the node):
#   pki/ca.{crt,key}                          cluster CA (CN=kubernetes)
#   pki/apiserver.{crt,key}                   serving cert: 127.0.0.1, the node IP, the kubernetes
#                                             Service IP and names; key root 0600 as kubeadm writes it
#   pki/apiserver-kubelet-client.{crt,key}    kube-apiserver -> kubelet (O=system:masters)
#   pki/front-proxy-ca.{crt,key}, pki/front-proxy-client.{crt,key}   aggregation layer
#   pki/sa.{key,pub}                          ServiceAccount token signing
#   admin.conf kubelet.conf controller-manager.conf scheduler.conf kube-proxy.conf
# EC P-256 keys, certificates valid for PKI_DAYS days. Needs: openssl, base64.
# Uses: ETC_K8S NODE_NAME NODE_IP SERVICE_IP APISERVER_URL.

PKI_DAYS=30

pki_key() { # pki_key FILE: a new EC P-256 key, 0600
	(umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null)
}

pki_ca() { # pki_ca NAME CN
	local d=$ETC_K8S/pki
	pki_key "$d/$1.key"
	openssl req -x509 -new -key "$d/$1.key" -subj "/CN=$2" -days "$PKI_DAYS" -out "$d/$1.crt" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
}

pki_cert() { # pki_cert NAME CA SUBJECT EXT_KEY_USAGE [SAN]
	local d=$ETC_K8S/pki name=$1 ca=$2 subj=$3 eku=$4 san=${5:-}
	local ext
	ext=$(mktemp "$d/.ext.XXXXXX")
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[ -z "$san" ] || echo "subjectAltName=$san"
	} >"$ext"
	pki_key "$d/$name.key"
	openssl req -new -key "$d/$name.key" -subj "$subj" 2>/dev/null |
		openssl x509 -req -CA "$d/$ca.crt" -CAkey "$d/$ca.key" -CAcreateserial -days "$PKI_DAYS" \
			-extfile "$ext" -out "$d/$name.crt" 2>/dev/null
	rm -f "$ext" "$d/$ca.srl"
}

pki_kubeconfig() { # pki_kubeconfig FILE CERT_NAME USER: a kubeconfig with the client cert embedded
	local d=$ETC_K8S/pki
	(umask 077 && cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $NODE_NAME
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(base64 -w0 "$d/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $(base64 -w0 "$d/$2.crt")
    client-key-data: $(base64 -w0 "$d/$2.key")
contexts:
- name: $3@$NODE_NAME
  context: {cluster: $NODE_NAME, user: $3}
current-context: $3@$NODE_NAME
EOF
	)
}

# pki_ensure: writes the PKI once (a cold start); refuses a work dir whose CA expires within a day.
pki_ensure() {
	local d=$ETC_K8S/pki
	if [ -s "$d/ca.crt" ] && [ -s "$ETC_K8S/admin.conf" ]; then
		openssl x509 -in "$d/ca.crt" -noout -checkend 86400 >/dev/null ||
			die "the node's CA in $d expires within a day: run node.sh clean (a new PKI is made at the next up)"
		return 0
	fi
	mkdir -p "$d"
	chmod 0755 "$ETC_K8S" "$d"
	pki_ca ca kubernetes
	pki_ca front-proxy-ca front-proxy-ca
	pki_cert apiserver ca "/CN=kube-apiserver" serverAuth \
		"IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:$NODE_NAME,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	pki_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
	pki_cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" clientAuth
	pki_key "$d/sa.key"
	openssl pkey -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
	pki_cert admin ca "/O=system:masters/CN=kubernetes-admin" clientAuth
	pki_cert kubelet-client ca "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
	pki_cert controller-manager-client ca "/CN=system:kube-controller-manager" clientAuth
	pki_cert scheduler-client ca "/CN=system:kube-scheduler" clientAuth
	pki_cert kube-proxy-client ca "/CN=system:kube-proxy" clientAuth
	pki_kubeconfig "$ETC_K8S/kubelet.conf" kubelet-client "system:node:$NODE_NAME"
	pki_kubeconfig "$ETC_K8S/controller-manager.conf" controller-manager-client system:kube-controller-manager
	pki_kubeconfig "$ETC_K8S/scheduler.conf" scheduler-client system:kube-scheduler
	pki_kubeconfig "$ETC_K8S/kube-proxy.conf" kube-proxy-client system:kube-proxy
	# admin.conf last: its presence marks a complete PKI.
	pki_kubeconfig "$ETC_K8S/admin.conf" admin kubernetes-admin
}
