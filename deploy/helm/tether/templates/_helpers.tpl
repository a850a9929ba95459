{{/* Labels every object carries. */}}
{{- define "tether.labels" -}}
app.kubernetes.io/name: tether
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "tether.image" -}}
{{ required "image.repository is required: tether publishes no image. Build it (deploy/image/build.sh REGISTRY/tether:TAG), push it to a registry your nodes pull from, and set image.repository=REGISTRY/tether (values.yaml, image)" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Whether this rendering holds the API objects (not nodeManifests=true). */}}
{{- define "tether.apiObjects" -}}
{{- if not .Values.nodeManifests }}true{{ end }}
{{- end }}

{{/*
A node-side document (static Pod, sidecar patch) is rendered only by `helm template` with
nodeManifests=true. `helm install` and `upgrade` can look kube-system up, `helm template`
cannot: there, it fails before anything is created.
*/}}
{{- define "tether.nodeManifestsOnlyByTemplate" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" }}
{{- fail "nodeManifests=true renders the server's node-side document for `helm template ... > FILE` only: it must not be installed through the API (a static Pod or a patch is no API object). Install without it; NOTES.txt shows the template command" }}
{{- end }}
{{- end }}

{{/* Fails early on combinations that cannot work. */}}
{{- define "tether.validate" -}}
{{- if not (has .Values.server.kind (list "staticPod" "sidecar" "deployment" "none")) }}
{{- fail (printf "server.kind must be staticPod, sidecar, deployment or none, got %q" .Values.server.kind) }}
{{- end }}
{{- if not (has .Values.auth.mode (list "token" "mtls")) }}
{{- fail (printf "auth.mode must be token or mtls, got %q" .Values.auth.mode) }}
{{- end }}
{{- if and .Values.nodeManifests (not (include "tether.onNode" .)) }}
{{- fail (printf "nodeManifests=true renders the static Pod (server.kind=staticPod) or the kube-apiserver patch (server.kind=sidecar); server.kind=%s has no node-side document" .Values.server.kind) }}
{{- end }}
{{- if and .Values.agent.enabled (not .Values.agent.proxyServerHost) (not .Values.nodeManifests) }}
{{- fail "agent.proxyServerHost is required: the address (load balancer or Service) where agents reach the proxy servers" }}
{{- end }}
{{- if and (eq .Values.auth.mode "mtls") .Values.agent.identifiers (not .Values.auth.agentIdentityBinding) }}
{{- fail "auth.mode=mtls gives every agent the one certificate of agent.tlsSecretName, which proves no node, so the server (--agent-identity-binding=identifiers) would refuse every agent's host=/ipv4= identifiers: set auth.agentIdentityBinding=off to route by them anyway (any agent could then claim any node), or agent.identifiers=\"\" with server.proxyStrategies=default to route without them (values.yaml, auth.agentIdentityBinding)" }}
{{- end }}
{{- if and .Values.agent.enabled (not .Values.agent.identifiers) (ne .Values.server.kind "none") (eq (first (splitList "," .Values.server.proxyStrategies)) "destHost") }}
{{- fail "agent.identifiers=\"\" gives no agent a node identity, and a server is Ready only when its first proxy strategy has an agent (as upstream's): with server.proxyStrategies=destHost,... no server would ever be Ready. Set server.proxyStrategies=default (values.yaml, server.proxyStrategies)" }}
{{- end }}
{{- if and (eq .Values.server.audit.output "file") (eq .Values.server.kind "deployment") }}
{{- fail "server.audit.output=file writes to the control-plane node (server.kind=staticPod or sidecar); a Deployment's pod has no volume that outlives it and nothing there rotates the file: use server.audit.output=stdout (values.yaml, server.audit)" }}
{{- end }}
{{- if and (eq .Values.agent.serverDiscovery "leases") (not .Values.leases.enabled) }}
{{- fail "agent.serverDiscovery=leases reads the agent address each server publishes in its Lease: set leases.enabled=true" }}
{{- end }}
{{- if and (eq .Values.agent.serverDiscovery "dns") (ne .Values.server.kind "deployment") }}
{{- fail (printf "agent.serverDiscovery=dns finds the server pods through a headless Service, which the chart makes for server.kind=deployment; with server.kind=%s use agent.serverDiscovery=leases (with leases.enabled=true)" .Values.server.kind) }}
{{- end }}
{{- if and .Values.peering.enabled (not .Values.leases.enabled) }}
{{- fail "peering.enabled finds the peer servers in their Leases: set leases.enabled=true" }}
{{- end }}
{{- if and (gt (int .Values.agent.serverConnections) 0) (not .Values.peering.enabled) }}
{{- fail "agent.serverConnections holds that many servers per agent: without peering.enabled the other servers' clients could not reach the agent. Set peering.enabled=true, or agent.serverConnections=0" }}
{{- end }}
{{- if and (gt (int .Values.agent.serverConnections) 0) (eq .Values.agent.serverDiscovery "balancer") }}
{{- fail "agent.serverConnections chooses servers by their own addresses: use agent.serverDiscovery=leases (or dns)" }}
{{- end }}
{{- if and .Values.leases.enabled (eq .Values.leases.namespace "kube-system") (not .Values.leases.allowSharedNamespace) }}
{{- fail "leases.namespace=kube-system would let the server delete every Lease there, kube-controller-manager's and kube-scheduler's leader Leases included: use a namespace of its own (the default, konnectivity-leases), or set leases.allowSharedNamespace=true" }}
{{- end }}
{{- end }}

{{/* Whether the server runs on the control-plane node's network, next to kube-apiserver. */}}
{{- define "tether.onNode" -}}
{{- if has .Values.server.kind (list "staticPod" "sidecar") }}true{{ end }}
{{- end }}

{{/* The server's kubeconfig path, or "" for the in-cluster ServiceAccount. */}}
{{- define "tether.serverKubeconfig" -}}
{{- if include "tether.onNode" . }}{{ .Values.server.hostFiles.kubeconfig }}
{{- else if .Values.server.kubeconfigSecretName }}/etc/tether/kubeconfig/kubeconfig
{{- end }}
{{- end }}

{{/* The server's --audit-log-path, or "" for none. */}}
{{- define "tether.auditLogPath" -}}
{{- if eq .Values.server.audit.output "stdout" }}-
{{- else if eq .Values.server.audit.output "file" }}{{ .Values.server.audit.hostDir }}/audit.log
{{- end }}
{{- end }}

{{/* Whether the server talks to the Kubernetes API at all. */}}
{{- define "tether.serverUsesApi" -}}
{{- if or (eq .Values.auth.mode "token") .Values.leases.enabled }}true{{ end }}
{{- end }}

{{- define "tether.serverArgs" -}}
- --logtostderr=true
{{- if include "tether.onNode" . }}
- --mode=grpc
- --uds-name={{ .Values.server.udsDir }}/{{ .Values.server.udsName }}
- --delete-existing-uds-file=true
- --server-port=0
- --cluster-cert={{ .Values.server.hostFiles.clusterCert }}
- --cluster-key={{ .Values.server.hostFiles.clusterKey }}
- --health-bind-address=127.0.0.1
{{- else }}
- --mode=http-connect
- --server-port={{ .Values.server.frontendPort }}
- --server-cert=/etc/tether/tls/frontend.crt
- --server-key=/etc/tether/tls/frontend.key
- --server-ca-cert=/etc/tether/tls/frontend-ca.crt
- --cluster-cert=/etc/tether/tls/cluster.crt
- --cluster-key=/etc/tether/tls/cluster.key
{{- end }}
- --agent-port={{ .Values.server.agentPort }}
- --admin-port={{ .Values.server.adminPort }}
- --health-port={{ .Values.server.healthPort }}
- --graceful-shutdown-timeout={{ .Values.server.gracefulShutdownSeconds }}s
- --server-count={{ .Values.server.count }}
- --proxy-strategies={{ .Values.server.proxyStrategies }}
{{- if eq .Values.auth.mode "token" }}
- --agent-namespace={{ .Values.auth.token.agentNamespace | default .Release.Namespace }}
- --agent-service-account={{ .Values.agent.serviceAccount.name }}
- --authentication-audience={{ .Values.auth.token.audience }}
{{- with .Values.auth.agentIdentityBinding }}
- --agent-identity-binding={{ . }}
{{- end }}
{{- else }}
- --cluster-ca-cert={{ if include "tether.onNode" . }}{{ .Values.server.hostFiles.clusterCaCert }}{{ else }}/etc/tether/tls/agent-ca.crt{{ end }}
- --agent-identity-binding={{ .Values.auth.agentIdentityBinding | default "identifiers" }}
{{- end }}
{{- if include "tether.serverUsesApi" . }}
- --kubeconfig={{ include "tether.serverKubeconfig" . }}
{{- end }}
{{- if .Values.leases.enabled }}
- --enable-lease-controller=true
- --lease-namespace={{ .Values.leases.namespace }}
- --lease-label={{ .Values.leases.label }}
{{- if eq .Values.agent.serverDiscovery "leases" }}
- --lease-agent-address=$(POD_IP)
{{- end }}
{{- if .Values.peering.enabled }}
- --lease-peer-address=$(POD_IP)
{{- end }}
{{- end }}
{{- if .Values.peering.enabled }}
- --peer-port={{ .Values.peering.port }}
- --peer-name={{ .Values.peering.name }}
{{- if include "tether.onNode" . }}
- --peer-cert-file={{ .Values.server.hostFiles.peerCert }}
- --peer-key-file={{ .Values.server.hostFiles.peerKey }}
- --peer-ca-cert={{ .Values.server.hostFiles.peerCaCert }}
{{- else }}
- --peer-cert-file=/etc/tether/peer/tls.crt
- --peer-key-file=/etc/tether/peer/tls.key
- --peer-ca-cert=/etc/tether/peer/ca.crt
{{- end }}
{{- end }}
- --control-plane-endpoints={{ .Values.server.controlPlaneEndpoints }}
{{- with include "tether.auditLogPath" . }}
- --audit-log-path={{ . }}
{{- end }}
{{- with .Values.server.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The server container, shared by the static Pod, the sidecar patch and the Deployment. */}}
{{- define "tether.serverContainer" -}}
name: konnectivity-server
image: {{ include "tether.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
command: [/proxy-server]
args:
{{- include "tether.serverArgs" . | nindent 2 }}
env:
  # Leases are named after the server ID: the pod's name is stable across container restarts.
  - name: PROXY_SERVER_ID
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- if or (eq .Values.agent.serverDiscovery "leases") .Values.peering.enabled }}
  # Published in the server's Lease (--lease-agent-address, --lease-peer-address) for agents
  # and peer servers that find servers there.
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  {{- end }}
ports:
  - name: agentport
    containerPort: {{ .Values.server.agentPort }}
  - name: healthport
    containerPort: {{ .Values.server.healthPort }}
  {{- if not (include "tether.onNode" .) }}
  - name: frontend
    containerPort: {{ .Values.server.frontendPort }}
  {{- end }}
  {{- if .Values.peering.enabled }}
  - name: peerport
    containerPort: {{ .Values.peering.port }}
  {{- end }}
livenessProbe:
  httpGet:
    {{- if include "tether.onNode" . }}
    host: 127.0.0.1
    {{- end }}
    path: /healthz
    port: {{ .Values.server.healthPort }}
  initialDelaySeconds: 10
  timeoutSeconds: 5
{{- if ne .Values.server.kind "sidecar" }}
# Ready once an agent is connected: kube-apiserver's Service (hosted) routes only to servers
# that can carry its dials. No readiness in the sidecar: it would make kube-apiserver's own
# Pod NotReady while no agent is connected.
readinessProbe:
  httpGet:
    {{- if include "tether.onNode" . }}
    host: 127.0.0.1
    {{- end }}
    path: /readyz
    port: {{ .Values.server.healthPort }}
  periodSeconds: 5
  timeoutSeconds: 5
{{- end }}
resources:
  {{- toYaml .Values.server.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
{{- if include "tether.onNode" . }}
  - name: konnectivity-uds
    mountPath: {{ .Values.server.udsDir }}
  - name: cluster-cert
    mountPath: {{ .Values.server.hostFiles.clusterCert }}
    readOnly: true
  - name: cluster-key
    mountPath: {{ .Values.server.hostFiles.clusterKey }}
    readOnly: true
  {{- if eq .Values.auth.mode "mtls" }}
  - name: cluster-ca-cert
    mountPath: {{ .Values.server.hostFiles.clusterCaCert }}
    readOnly: true
  {{- end }}
  {{- if include "tether.serverUsesApi" . }}
  - name: kubeconfig
    mountPath: {{ .Values.server.hostFiles.kubeconfig }}
    readOnly: true
  {{- end }}
  {{- if eq .Values.server.audit.output "file" }}
  - name: konnectivity-audit
    mountPath: {{ .Values.server.audit.hostDir }}
  {{- end }}
  {{- if .Values.peering.enabled }}
  {{- range $name, $path := dict "peer-cert" .Values.server.hostFiles.peerCert "peer-key" .Values.server.hostFiles.peerKey "peer-ca-cert" .Values.server.hostFiles.peerCaCert }}
  - name: {{ $name }}
    mountPath: {{ $path }}
    readOnly: true
  {{- end }}
  {{- end }}
{{- else }}
  - name: tls
    mountPath: /etc/tether/tls
    readOnly: true
  {{- if .Values.peering.enabled }}
  - name: peer-tls
    mountPath: /etc/tether/peer
    readOnly: true
  {{- end }}
  {{- if and (include "tether.serverUsesApi" .) .Values.server.kubeconfigSecretName }}
  - name: kubeconfig
    mountPath: /etc/tether/kubeconfig
    readOnly: true
  {{- end }}
{{- end }}
{{- end }}

{{/* hostPath volumes of the server on a control-plane node. */}}
{{- define "tether.serverHostVolumes" -}}
# Prepared on the node, owned by securityContext.runAsUser (README): a directory created
# here would belong to root, where a non-root server cannot create its socket.
- name: konnectivity-uds
  hostPath:
    path: {{ .Values.server.udsDir }}
    type: Directory
- name: cluster-cert
  hostPath:
    path: {{ .Values.server.hostFiles.clusterCert }}
    type: File
- name: cluster-key
  hostPath:
    path: {{ .Values.server.hostFiles.clusterKey }}
    type: File
{{- if eq .Values.auth.mode "mtls" }}
- name: cluster-ca-cert
  hostPath:
    path: {{ .Values.server.hostFiles.clusterCaCert }}
    type: File
{{- end }}
{{- if include "tether.serverUsesApi" . }}
- name: kubeconfig
  hostPath:
    path: {{ .Values.server.hostFiles.kubeconfig }}
    type: File
{{- end }}
{{- if eq .Values.server.audit.output "file" }}
# The audit log's directory, prepared on the node like the socket's (values.yaml,
# server.audit). Its own name: kube-apiserver's Pod, which the sidecar patch merges into,
# often has a volume called audit-log.
- name: konnectivity-audit
  hostPath:
    path: {{ .Values.server.audit.hostDir }}
    type: Directory
{{- end }}
{{- if .Values.peering.enabled }}
{{- range $name, $path := dict "peer-cert" .Values.server.hostFiles.peerCert "peer-key" .Values.server.hostFiles.peerKey "peer-ca-cert" .Values.server.hostFiles.peerCaCert }}
- name: {{ $name }}
  hostPath:
    path: {{ $path }}
    type: File
{{- end }}
{{- end }}
{{- end }}

{{/* Who the server is to the API: its ServiceAccount in-cluster, else its kubeconfig's user. */}}
{{- define "tether.serverSubject" -}}
{{- if .inCluster }}
- kind: ServiceAccount
  name: konnectivity-server
  namespace: {{ .root.Release.Namespace }}
{{- else }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {{ .root.Values.server.rbacUser }}
{{- end }}
{{- end }}
