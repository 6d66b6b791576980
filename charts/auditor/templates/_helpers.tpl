{{/* Labels of every object: the NetworkPolicies select the auditor's pods by part-of. */}}
{{- define "auditor.labels" -}}
app.kubernetes.io/name: gpu-waste-auditor
app.kubernetes.io/part-of: gpu-waste-auditor
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* Selector labels (immutable once created): name and component. */}}
{{- define "auditor.selector" -}}
app.kubernetes.io/name: gpu-waste-auditor
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of a pod template. */}}
{{- define "auditor.podLabels" -}}
{{ include "auditor.selector" . }}
app.kubernetes.io/part-of: gpu-waste-auditor
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{- define "auditor.image" -}}
{{- $v := .Values.image -}}
{{- if $v.digest -}}
{{ $v.repository }}@{{ $v.digest }}
{{- else -}}
{{ $v.repository }}:{{ $v.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* checkov's image-digest check, skipped (with the reason) while the image is a tag. */}}
{{- define "auditor.digestSkip" -}}
{{- if not .Values.image.digest -}}
checkov.io/skip1: CKV_K8S_43=the image is pinned by tag; set image.digest for production
{{- end }}
{{- end }}

{{- define "auditor.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of a component's values. */}}
{{- define "auditor.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod securityContext of a non-root auditor pod (uid and gid 10001). */}}
{{- define "auditor.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  {{- if .fsGroup }}
  # a fresh volume is root-owned on most provisioners: the kubelet gives it this group
  # (once, while its root has another owner) so the pod can write
  fsGroup: 10001
  fsGroupChangePolicy: OnRootMismatch
  {{- end }}
  seccompProfile: { type: RuntimeDefault }
{{- end }}

{{/* The container securityContext of a non-root auditor container. */}}
{{- define "auditor.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  runAsUser: 10001
  capabilities: { drop: ["ALL"] }
  seccompProfile: { type: RuntimeDefault }
{{- end }}

{{/* The Secret with the database URL (in both namespaces). */}}
{{- define "auditor.dbSecret" -}}
{{- if eq .Values.database.type "postgres" -}}
auditor-db
{{- else -}}
{{ .Values.database.external.secretName }}
{{- end -}}
{{- end }}

{{- define "auditor.dbKey" -}}
{{- if eq .Values.database.type "postgres" -}}
url
{{- else -}}
{{ .Values.database.external.secretKey }}
{{- end -}}
{{- end }}

{{/* The database port the NetworkPolicies open. */}}
{{- define "auditor.dbPort" -}}
{{- if eq .Values.database.type "postgres" -}}
5432
{{- else -}}
{{ .Values.database.external.port }}
{{- end -}}
{{- end }}

{{/* Environment of a container that reads the database URL and the config; with root,
also the cluster this release runs in (AUDITOR_CLUSTER: what the sampler and the watcher
record, and what the audit CronJob passes to --cluster). */}}
{{- define "auditor.env" -}}
- { name: AUDITOR_DB_URL_FILE, value: /etc/auditor/db/url }
{{- with .root }}
- { name: AUDITOR_CLUSTER, value: {{ .Values.cluster | quote }} }
{{- end }}
{{- if .config }}
- { name: AUDITOR_CONFIG, value: /etc/auditor/config/config.toml }
{{- end }}
{{- end }}

{{- define "auditor.mounts" -}}
- { name: db, mountPath: /etc/auditor/db, readOnly: true }
{{- if .config }}
- { name: config, mountPath: /etc/auditor/config, readOnly: true }
{{- end }}
- { name: tmp, mountPath: /tmp }
{{- end }}

{{- define "auditor.volumes" -}}
- name: db
  secret:
    secretName: {{ include "auditor.dbSecret" .root }}
    items: [{ key: {{ include "auditor.dbKey" .root }}, path: url }]
{{- if .config }}
- name: config
  configMap:
    name: auditor-config
{{- end }}
- name: tmp
  emptyDir: { sizeLimit: {{ .tmp | default "256Mi" }} }
{{- end }}

{{/* Rolls a long-running pod when its configuration changes. */}}
{{- define "auditor.configChecksum" -}}
checksum/config: {{ toToml .Values.config | sha256sum }}
{{- end }}
